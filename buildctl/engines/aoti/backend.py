"""The aoti backend: a real, environment-bound engine compiled with torch AOTInductor.

The build exports the two graphs of a Llama with a KV cache (:mod:`buildctl.engines.aoti.kv_llama`:
a prefill graph and a decode graph) and compiles each into a package, ``prefill.pt2`` and
``decode.pt2``, in an isolated subprocess (:mod:`buildctl.engines.aoti.compile`), for a portable
ISA by default (``ATEN_CPU_CAPABILITY=avx2``, ``TORCHINDUCTOR_CPP_MARCH=x86-64-v3``) because
``-march=native`` output may crash on another CPU. Precompiled headers are off and the inductor
cache and temp files stay inside the build's own temp dir. Only the Llama family is supported:
the build refuses another architecture before compiling.

AOTInductor's own metadata records only device, platform and ISA, so the build adds a record
(``engine.json``, also embedded in both packages' metadata) with the compat key and its fields,
torch and compiler versions, ISA, dtype, model digest and the KV cache's shape and size (from
``max_batch_size`` x ``max_seq_len``). Loading refuses an engine whose record's compat key
differs from this host's, naming each difference.

The runner owns the cache and batches in flight (:mod:`buildctl.engines.batching`): requests
join and leave at every step. Engines of record format 1 (one ``model.pt2`` graph, no KV cache,
built before format 2) still load and generate, so stores written before keep serving.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any, ClassVar, Iterator

from buildctl.engines.backend import BuildResult, Generation, TokenEvent
from buildctl.engines.batching import ContinuousBatcher, Request
from buildctl.engines.compat import CompatField, Floor, version_tuple
from buildctl.engines.errors import EngineBuildError, EngineLoadError, IncompatibleTargetError
from buildctl.engines.fingerprint import Fingerprint, compiler_major, host_fingerprint
from buildctl.engines.isolate import run_step
from buildctl.engines.profile import ISA_ENV, BuildProfile, EngineSpec, rule_error
from buildctl.core.settings import Settings

log = logging.getLogger(__name__)

RECORD_FORMAT = 2
ENGINE_FILES = ("decode.pt2", "engine.json", "prefill.pt2")
# The files of each record format this version loads (format 1: one logits graph, no KV cache).
FORMAT_FILES = {1: ("engine.json", "model.pt2"), 2: ENGINE_FILES}


# What an AOTInductor package is bound to, and how hard (docs/upgrades.md explains each). A
# compiled package needs the ISA it was compiled for, the torch that compiled it and the C++
# runtime; it does not need the node's compiler to load.
COMPAT_FIELDS: tuple[CompatField, ...] = (
    CompatField("cpu.isa_level", "hard", "code compiled for a higher x86-64 level dies with SIGILL ('Illegal "
                "instruction') on a lower one (TORCHINDUCTOR_CPP_MARCH / ATEN_CPU_CAPABILITY of the build)"),
    CompatField("torch_version", "hard", "PyTorch AOTInductor docs: a package is loaded by "
                "torch._inductor.aoti_load_package of the release that compiled it (its package format and libtorch ABI)"),
    CompatField("platform", "hard", "a compiled .so loads only on its own OS and architecture ('wrong ELF class', "
                "'invalid ELF header')"),
    CompatField("cpu.flags", "soft", "libtorch dispatches its own kernels on the CPU's flags at run time (ATen CPU "
                "capability): numerics and speed may change"),
    CompatField("compiler_version", "soft", "the host's libstdc++ comes with its compiler; a package needs the "
                "GLIBCXX symbols it was linked against ('version `GLIBCXX_3.4.30' not found')"),
    CompatField("glibc_version", "soft", "a .so linked against a newer glibc fails with 'version `GLIBC_2.xx' not found'"),
)


def _glibc_floor(host: dict[str, Any], built_on: dict[str, Any] | None) -> str | None:
    need = version_tuple((built_on or {}).get("glibc_version"))
    have = version_tuple(host.get("glibc_version"))
    if need is None or have is None or have >= need:
        return None
    return f"built against glibc {built_on['glibc_version']}: this host has {host['glibc_version']}"  # type: ignore[index]


FLOORS: tuple[Floor, ...] = (
    Floor("glibc >= the build host's", ("glibc_version",),
          "glibc is backward compatible only: a .so linked against a newer glibc fails with 'GLIBC_2.xx not found'",
          _glibc_floor),
)


def cache_shape(config: dict[str, Any], max_batch: int, max_seq: int) -> list[int]:
    """The runner's KV cache: ``[layers, 2, max_batch, kv_heads, max_seq, head_dim]``."""
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    return [int(config["num_hidden_layers"]), 2, max_batch, int(config.get("num_key_value_heads") or heads), max_seq,
            head_dim]


def build_record(profile: BuildProfile, fingerprint: Fingerprint, model_dir: Path, model_digest: str | None) -> dict[str, Any]:
    config = json.loads((model_dir / "config.json").read_text())
    shape = cache_shape(config, profile.engine.max_batch_size, profile.engine.max_seq_len)
    itemsize = 2 if profile.model.dtype in ("float16", "bfloat16") else 4
    return {
        "format": RECORD_FORMAT,
        "backend": "aoti",
        "profile": profile.name,
        "profile_hash": profile.build_hash(),
        "compat_key": fingerprint.compat_key("aoti"),
        "compat_fields": fingerprint.compat_fields("aoti"),
        "torch": fingerprint.torch_version,
        "compiler": fingerprint.compiler_version,
        "host_isa_level": fingerprint.cpu.isa_level,
        "cpu_isa": profile.engine.resolved_aoti.cpu_isa,
        "device": profile.engine.resolved_aoti.device,
        "dtype": profile.model.dtype,
        "model_digest": model_digest,
        "max_seq_len": profile.engine.max_seq_len,
        "max_batch_size": profile.engine.max_batch_size,
        "vocab_size": config.get("vocab_size"),
        "eos_token_id": config.get("eos_token_id"),
        "architecture": (config.get("architectures") or [None])[0],
        "cache_shape": shape,
        "cache_bytes": math.prod(shape) * itemsize,
        "prefill_tokens": profile.engine.max_num_tokens or profile.engine.max_input_len,
    }


def read_record(engine_dir: Path) -> dict[str, Any]:
    p = engine_dir / "engine.json"
    if not p.is_file() or p.stat().st_size == 0:
        raise EngineLoadError(str(engine_dir), "engine.json is missing or empty")
    try:
        record = json.loads(p.read_text())
    except (OSError, ValueError) as err:
        raise EngineLoadError(str(engine_dir), f"engine.json unreadable: {err}") from None
    if not isinstance(record, dict) or record.get("format") not in FORMAT_FILES or record.get("backend") != "aoti":
        raise EngineLoadError(str(engine_dir), "engine.json is not an aoti build record of a known format")
    for name in FORMAT_FILES[record["format"]]:
        p = engine_dir / name
        if not p.is_file() or p.stat().st_size == 0:
            raise EngineLoadError(str(engine_dir), f"{name} is missing or empty")
    return record


# A schema-1 record's compat fields, by the label of the hard field they held (compiler_major was
# one of them and is no longer hard).
_LEGACY_RECORD_FIELDS = {"isa_level": "cpu.isa_level", "torch": "torch_version", "platform": "platform"}


def check_compat(engine_dir: Path, record: dict[str, Any], host: Fingerprint) -> None:
    """Refuse an engine built for another compat key, naming every differing hard field. A record
    written under a schema-1 key is compared on the hard fields it recorded."""
    if record.get("compat_key") in (host.compat_key("aoti"), host.legacy_compat_key("aoti")):
        return
    mine = host.compat_fields("aoti")
    theirs = dict(record.get("compat_fields") or {})
    if "backend" in theirs and "cpu.isa_level" not in theirs:  # schema 1
        theirs = {"backend": theirs["backend"], **{new: theirs.get(old) for old, new in _LEGACY_RECORD_FIELDS.items()}}
        if theirs == mine:
            return
    diff = {k: (theirs.get(k), mine[k]) for k in mine if theirs.get(k) != mine[k]} or {"compat_key": (record.get("compat_key"), host.compat_key("aoti"))}
    raise IncompatibleTargetError(f"aoti engine {engine_dir} was built for another host", diff)


class AotiBackend:
    name: ClassVar[str] = "aoti"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @staticmethod
    def tool_version(fingerprint: Fingerprint) -> str | None:
        return fingerprint.torch_version

    @staticmethod
    def gpus_needed(profile: BuildProfile) -> int:
        return 1 if profile.engine.resolved_aoti.device == "cuda" else 0  # AOTInductor compiles for one device

    compat: ClassVar[tuple[CompatField, ...]] = COMPAT_FIELDS
    floors: ClassVar[tuple[Floor, ...]] = FLOORS

    @staticmethod
    def legacy_compat_fields(fingerprint: Fingerprint) -> dict[str, Any]:
        """The fields of schema-1 compat keys (before the hard/soft split), exactly as they were."""
        return {
            "isa_level": fingerprint.cpu.isa_level,
            "torch": fingerprint.torch_version,
            "platform": fingerprint.platform,
            "compiler_major": compiler_major(fingerprint.compiler_version),
        }

    engine_format: ClassVar[int] = RECORD_FORMAT
    records_host: ClassVar[bool] = True

    @staticmethod
    def recognises(engine_dir: Path) -> bool:
        return (engine_dir / "engine.json").is_file() and any(
            all((engine_dir / n).is_file() for n in files) for files in FORMAT_FILES.values())

    @staticmethod
    def check_engine_spec(spec: EngineSpec) -> None:
        """aoti-only rules of a profile's engine section."""
        if spec.calibration is not None:
            raise rule_error("calibration", "calibration-trtllm-only", "calibration applies to backend trtllm only")
        if spec.quantization != "none":
            raise rule_error("quantization", "aoti-no-quantization",
                             "quantization {q!r} needs backend trtllm; aoti builds only unquantized engines", q=spec.quantization)
        if spec.kv_cache_dtype not in ("auto",):
            raise rule_error("kv_cache_dtype", "aoti-no-kv-cache-dtype",
                             "kv_cache_dtype {k!r} needs backend trtllm; aoti has no KV cache option", k=spec.kv_cache_dtype)
        if spec.tp_size * spec.pp_size != 1:
            raise rule_error("tp_size", "aoti-single-rank", "tp_size * pp_size must be 1 for aoti (got {n})",
                             n=spec.tp_size * spec.pp_size)
        if spec.plugins is not None:
            raise rule_error("plugins", "plugins-trtllm-only", "plugins apply to backend trtllm only")
        if spec.vllm is not None:
            raise rule_error("vllm", "vllm-options-vllm-only", "vllm options apply to backend vllm only")

    def unmet_requirements(self, profile: BuildProfile, fingerprint: Fingerprint) -> list[str]:
        if profile.engine.resolved_aoti.device == "cuda" and not fingerprint.gpus:
            return ["a GPU (aoti device cuda): this host has none"]
        return []

    def build(self, profile: BuildProfile, model_dir: Path, out_dir: Path, fingerprint: Fingerprint,
              log_path: Path, *, model_digest: str | None = None) -> BuildResult:
        opts = profile.engine.resolved_aoti
        if opts.device == "cuda" and not fingerprint.gpus:
            raise IncompatibleTargetError("aoti device cuda needs a GPU", {"gpus": ("at least one", "none")})
        from buildctl.engines.aoti.kv_llama import check_supported

        try:
            problems = check_supported(json.loads((Path(model_dir) / "config.json").read_text()))
        except (OSError, ValueError) as err:
            raise EngineBuildError("aoti", "error", f"the checkpoint's config.json is unreadable: {err}") from None
        if problems:
            raise EngineBuildError("aoti", "error", f"aoti builds Llama-family checkpoints only: {'; '.join(problems)}")
        out_dir = Path(out_dir)
        if out_dir.exists():
            raise EngineBuildError("aoti", "error", f"output directory {out_dir} already exists")
        work = out_dir.parent / f".build-{uuid.uuid4().hex}"  # on the output's filesystem
        (work / "tmp").mkdir(parents=True)
        try:
            record = build_record(profile, fingerprint, model_dir, model_digest)
            (work / "record.json").write_text(json.dumps(record))
            env = dict(os.environ)
            env.update(ISA_ENV[opts.cpu_isa])
            env.update({"TMPDIR": str(work / "tmp"), "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor"),
                        "VLLM_CACHE_ROOT": str(work / "vllm"), "PYTHONUNBUFFERED": "1"})
            start = time.monotonic()
            cmd = (sys.executable, "-m", "buildctl.engines.aoti.compile", "--model", str(model_dir),
                   "--out", str(work / "out"), "--record", str(work / "record.json"))
            run_step("aoti", "aoti compile", cmd, log_path=log_path, timeout_s=profile.engine.build_timeout_s, env=env,
                     memory_limit_mb=profile.engine.build_memory_limit_mb)
            missing = [n for n in ENGINE_FILES if not (work / "out" / n).is_file() or (work / "out" / n).stat().st_size == 0]
            if missing:
                raise EngineBuildError("aoti", "incomplete", f"compile step exited 0 but left no {', '.join(missing)}",
                                       log_path=str(log_path))
            os.rename(work / "out", out_dir)
            wall = time.monotonic() - start
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return BuildResult(engine_dir=out_dir, files=sorted(ENGINE_FILES), log_path=log_path, wall_s=wall,
                           tool_versions={"torch": fingerprint.torch_version, "compiler": fingerprint.compiler_version},
                           commands=(cmd,))

    def load(self, engine_dir: Path) -> "AotiRunner | AotiRunnerV1":
        engine_dir = Path(engine_dir)
        record = read_record(engine_dir)
        check_compat(engine_dir, record, host_fingerprint(self.settings))
        return AotiRunner(engine_dir, record) if record["format"] == 2 else AotiRunnerV1(engine_dir, record)

    def check_tree(self, engine_dir: Path, fingerprint: Fingerprint) -> None:
        check_compat(Path(engine_dir), read_record(Path(engine_dir)), fingerprint)

    def preflight(self, engine_dir: Path) -> None:
        runner = self.load(engine_dir)
        try:
            runner.generate([[1, 5, 9]], max_tokens=2, top_logprobs=1)
        finally:
            runner.close()


class AotiRunnerV1:
    """Greedy generation on an engine of record format 1: one AOTInductor graph from ids to
    logits, no KV cache (each step recomputes the prefix), prompts of equal length batched in
    static waves."""

    name = "aoti"

    def __init__(self, engine_dir: Path, record: dict[str, Any]) -> None:
        import torch
        from torch._inductor import aoti_load_package

        self.torch = torch
        self.record = record
        self.model: Any
        try:
            self.model = aoti_load_package(str(engine_dir / "model.pt2"))
        except Exception as err:
            raise EngineLoadError(str(engine_dir), f"AOTInductor could not load model.pt2: {err}") from None
        embedded = self.model.get_metadata().get("buildctl_record")
        if embedded is None or json.loads(embedded) != record:
            raise EngineLoadError(str(engine_dir), "engine.json does not match the record embedded in model.pt2")
        self.max_seq_len = int(record["max_seq_len"])
        self.max_batch = int(record["max_batch_size"])

    def _check(self, prompts: list[list[int]], max_tokens: int) -> None:
        from buildctl.engines.errors import GenerationRequestError

        for p in prompts:
            if len(p) < 1 or len(p) + max_tokens > self.max_seq_len:
                raise GenerationRequestError(f"prompt of {len(p)} tokens + {max_tokens} new tokens does not fit "
                                             f"max_seq_len {self.max_seq_len}")

    def _step(self, ids: Any, k: int) -> tuple[list[int], list[dict[int, float]]]:
        torch = self.torch
        if ids.shape[1] < 2:  # the export's sequence dimension starts at 2
            ids = torch.cat([ids, ids[:, -1:]], dim=1)
            logits = self.model(ids)[:, -2, :]
        else:
            logits = self.model(ids)[:, -1, :]
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        chosen = torch.argmax(logprobs, dim=-1)
        tops: list[dict[int, float]] = []
        if k:
            vals, idx = torch.topk(logprobs, k, dim=-1)
            for row in range(ids.shape[0]):
                d = {int(t): float(v) for t, v in zip(idx[row].tolist(), vals[row].tolist())}
                c = int(chosen[row])
                d.setdefault(c, float(logprobs[row, c]))
                tops.append(d)
        return [int(c) for c in chosen.tolist()], tops

    def _groups(self, prompts: list[list[int]]) -> list[list[int]]:
        """Indices of prompts batched together: equal lengths, at most max_batch_size."""
        by_len: dict[int, list[int]] = {}
        for i, p in enumerate(prompts):
            by_len.setdefault(len(p), []).append(i)
        out = []
        for idxs in by_len.values():
            out += [idxs[i:i + self.max_batch] for i in range(0, len(idxs), self.max_batch)]
        return out

    def generate(self, prompts: list[list[int]], max_tokens: int, top_logprobs: int) -> list[Generation]:
        self._check(prompts, max_tokens)
        torch = self.torch
        results: list[Generation | None] = [None] * len(prompts)
        with torch.no_grad():
            for group in self._groups(prompts):
                ids = torch.tensor([prompts[i] for i in group], dtype=torch.long)
                gens = [Generation(token_ids=[], top_logprobs=[]) for _ in group]
                for _ in range(max_tokens):
                    chosen, tops = self._step(ids, top_logprobs)
                    for g, c, t in zip(gens, chosen, tops or [{}] * len(gens)):
                        g.token_ids.append(c)
                        if top_logprobs:
                            g.top_logprobs.append(t)
                    ids = torch.cat([ids, torch.tensor(chosen, dtype=torch.long).unsqueeze(1)], dim=1)
                for i, g in zip(group, gens):
                    results[i] = g
        return [r for r in results if r is not None]

    def stream(self, prompts: list[list[int]], max_tokens: int, concurrency: int) -> Iterator[TokenEvent]:
        """Static batching: waves of ``concurrency`` requests, all stepped together."""
        self._check(prompts, max_tokens)
        torch = self.torch
        clock = time.perf_counter
        with torch.no_grad():
            for w in range(0, len(prompts), max(1, concurrency)):
                wave = list(range(w, min(len(prompts), w + max(1, concurrency))))
                t0 = clock()
                for i in wave:
                    yield TokenEvent(i, None, t0)
                groups = [[wave[j] for j in g] for g in self._groups([prompts[i] for i in wave])]
                state = [torch.tensor([prompts[i] for i in g], dtype=torch.long) for g in groups]
                for _ in range(max_tokens):
                    for gi, group in enumerate(groups):
                        chosen, _ = self._step(state[gi], 0)
                        now = clock()
                        for i, c in zip(group, chosen):
                            yield TokenEvent(i, c, now)
                        state[gi] = torch.cat([state[gi], torch.tensor(chosen, dtype=torch.long).unsqueeze(1)], dim=1)

    def close(self) -> None:
        self.model = None


def load_package(path: Path) -> Any:
    """A compiled package's C++ loader (``torch._C._aoti.AOTIModelPackageLoader``), without
    ``torch._inductor.aoti_load_package``: that wrapper imports the whole inductor and dynamo stack
    (about 1.3 s here) and probes the CPU's vector ISA by compiling and loading a test program in a
    new Python process (about 0.4 s), only to log a warning that this backend's own compat check
    (the record's ISA level) already makes an error. One process loads in 6 ms instead of 2 s."""
    import torch

    return torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)


class _Packages:
    """The two loaded graphs as the batcher's :class:`~buildctl.engines.batching.KVModel`. Each
    graph takes and returns flat tensors, so the loader's ``boxed_run`` is called directly: no
    pytree flattening per step (about 10 us a step, by the #31 prototype)."""

    def __init__(self, prefill: Any, decode: Any, shape: list[int]) -> None:
        self._prefill, self._decode = prefill.boxed_run, decode.boxed_run
        self.layers, self.kv_heads, self.head_dim = shape[0], shape[3], shape[5]

    def prefill(self, ids: Any, last: Any) -> tuple[Any, Any]:
        logprobs, kv = self._prefill([ids, last])
        return logprobs, kv

    def decode(self, tokens: Any, positions: Any, mask: Any, cache: Any) -> tuple[Any, Any]:
        logprobs, new = self._decode([tokens, positions, mask, cache])
        return logprobs, new


class AotiRunner:
    """Greedy generation on a loaded engine of record format 2: the prefill and decode packages,
    a KV cache of the record's shape owned here, and in-flight batching
    (:class:`~buildctl.engines.batching.ContinuousBatcher`)."""

    name = "aoti"

    def __init__(self, engine_dir: Path, record: dict[str, Any]) -> None:
        self.record = record
        graphs = {}
        for name in ("prefill", "decode"):
            try:
                graphs[name] = load_package(engine_dir / f"{name}.pt2")
            except Exception as err:
                raise EngineLoadError(str(engine_dir), f"AOTInductor could not load {name}.pt2: {err}") from None
            embedded = graphs[name].get_metadata().get("buildctl_record")
            if embedded is None or json.loads(embedded) != record:
                raise EngineLoadError(str(engine_dir), f"engine.json does not match the record embedded in {name}.pt2")
        shape = [int(x) for x in record["cache_shape"]]
        if shape[2] != int(record["max_batch_size"]) or shape[4] != int(record["max_seq_len"]):
            raise EngineLoadError(str(engine_dir), "engine.json's cache shape does not match its batch size and length")
        self.max_seq_len = int(record["max_seq_len"])
        self.max_batch = int(record["max_batch_size"])
        self.batcher: ContinuousBatcher | None = ContinuousBatcher(
            _Packages(graphs["prefill"], graphs["decode"], shape), max_batch=self.max_batch,
            max_seq=self.max_seq_len, prefill_tokens=int(record["prefill_tokens"]))
        log.info("aoti engine %s: KV cache %s, %.1f MiB", engine_dir, shape, record["cache_bytes"] / 2**20)

    def _batcher(self) -> ContinuousBatcher:
        if self.batcher is None:
            raise EngineLoadError(str(self.record.get("profile")), "the engine was closed")
        return self.batcher

    def generate_requests(self, requests: list[Request], top_logprobs: int, concurrency: int | None = None) -> list[Generation]:
        """Each request with its own ``max_tokens`` and arrival step: requests join and leave mid-run."""
        return self._batcher().run(requests, top_logprobs, concurrency=concurrency)

    def generate(self, prompts: list[list[int]], max_tokens: int, top_logprobs: int) -> list[Generation]:
        return self.generate_requests([Request(p, max_tokens) for p in prompts], top_logprobs)

    def stream(self, prompts: list[list[int]], max_tokens: int, concurrency: int) -> Iterator[TokenEvent]:
        """``concurrency`` requests in flight; the next one arrives when one finishes. Events come
        after each step, stamped when they happened."""
        requests = [Request(p, max_tokens) for p in prompts]
        out = [Generation(token_ids=[], top_logprobs=[]) for _ in requests]
        for i, tok, t in self._batcher().events(requests, out, 0, concurrency=max(1, concurrency)):
            yield TokenEvent(i, tok, t)

    def close(self) -> None:
        self.batcher = None
