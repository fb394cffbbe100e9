"""The trtllm-torch backend: a **TensorRT-LLM PyTorch-backend bundle**, the start-up state of
``trtllm-serve`` built once per compat key.

Since 1.0 TensorRT-LLM serves through its PyTorch backend by default: no engine is built, but a
start tunes GEMM tactics (the autotuner) and JIT-compiles kernels (Triton, Inductor, FlashInfer,
DeepGEMM, CuTe DSL, torch extensions, the CUDA driver's PTX cache). A bundle holds that state::

    bundle.json          the record: release, versions, device, LLM-API arguments, each cache's host
    model/               the checkpoint (HF or ModelOpt; FP8 from ModelOpt's hf_quant_config.json)
    config.yaml          the LLM-API YAML (``trtllm-serve model --config config.yaml``)
    caches/autotuner/    TLLM_AUTOTUNER_CACHE_PATH=caches/autotuner/cache.json
    caches/<kind>/       one JIT cache per variable (CACHE_KINDS), the folder names of upstream's
                         unified root, so on 1.4 TRTLLM_CACHE_DIR=caches names them all

**The device check upstream lacks.** The autotuner's cache file records ``lib_version``,
``device_name`` and ``device_capability`` (tensorrt_llm/_torch/autotuner.py,
``AutoTunerProfilingCache._serialize_cache_to_json``), but loading it overwrites the live values
with the file's (``_deserialize_cache_from_json``) instead of comparing them; the PR that would
compare them (NVIDIA/TensorRT-LLM#17664) closed unmerged. So a cache tuned on an H100 loads on an
H200 and serves with the H100's tactics. Here every reader checks: :func:`cache_refusals` reads
the autotuner file's own metadata and each JIT cache's recorded host, at build, pull (preflight),
activate (preflight) and ``node env``, and names the cache and the field that differ.

**Read-only.** The runtime writes into its caches at start (the autotuner saves its file again at
the end of every ``autotune`` block). Every start serves from a fresh scratch copy, as the vllm
bundle does, and the verified copy stays byte-identical.

**Proof of use** (:func:`cache_evidence`): a warm start loaded the autotuner file (its log line),
tuned no new entry, and JIT-compiled no new file.

The release layouts (:data:`RELEASES`) follow the upstream sources named there; on this machine they
run against the strict fake in ``tests/support/fakes/pymods/tensorrt_llm`` only (no GPU, no
TensorRT-LLM): docs/trtllm-torch.md says what ran where.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Iterator

from buildctl.engines.backend import BuildResult, Generation, TokenEvent
from buildctl.engines.child_process import (CACHES, ChildRuntime, check_compat_key, names_backend, paired_starts,
                                            read_bundle_record, scratch_caches)
from buildctl.engines.compat import CUDA_DRIVER_FLOORS, CompatField, Floor, value_at
from buildctl.engines.errors import EngineBuildError, EngineLoadError, IncompatibleTargetError
from buildctl.engines.fingerprint import Fingerprint, host_fingerprint
from buildctl.engines.isolate import run_step
from buildctl.engines.profile import BuildProfile, EngineSpec, rule_error
from buildctl.core.settings import Settings

NAME = "trtllm-torch"
BUNDLE_FORMAT = 1
RECORD = "bundle.json"
MODEL = "model"
CONFIG = "config.yaml"
AUTOTUNER_FILE = "autotuner/cache.json"  # TLLM_AUTOTUNER_CACHE_PATH, under caches/

# Each JIT cache: its variable and the fingerprint fields whose change makes its contents wrong for
# a host. Folder names are those of upstream's unified root (tensorrt_llm/_bootstrap.py,
# _unified_cache_defaults), so one layout serves both releases.
CACHE_KINDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "autotuner": ("TLLM_AUTOTUNER_CACHE_PATH", ("tensorrt_llm_version", "gpus.name", "gpus.sm")),
    "inductor": ("TORCHINDUCTOR_CACHE_DIR", ("torch_version", "gpus.sm")),
    "triton": ("TRITON_CACHE_DIR", ("triton_version", "gpus.sm")),
    "torch_extensions": ("TORCH_EXTENSIONS_DIR", ("torch_version", "cuda_version")),
    "flashinfer": ("FLASHINFER_WORKSPACE_BASE", ("flashinfer_version", "cuda_version", "gpus.sm")),
    "cute_dsl": ("CUTE_DSL_CACHE_DIR", ("tensorrt_llm_version", "gpus.sm")),
    "deep_gemm": ("DG_JIT_CACHE_DIR", ("deep_gemm_version", "gpus.sm")),
    "trtllm_deep_gemm": ("TRTLLM_DG_CACHE_DIR", ("tensorrt_llm_version", "gpus.sm")),
    "cuda": ("CUDA_CACHE_PATH", ("cuda_version", "gpus.sm")),
}
# The fields of the autotuner file's metadata and the fingerprint field each one is.
AUTOTUNER_METADATA = {"lib_version": "tensorrt_llm_version", "device_name": "gpus.name",
                      "device_capability": "gpus.sm"}


@dataclass(frozen=True)
class Release:
    """What one TensorRT-LLM release reads: its cache variables and the autotuner file's layout."""

    version: str
    kinds: tuple[str, ...]
    unified_root: bool  # TRTLLM_CACHE_DIR sets every cache variable's default
    autotuner_layout: str  # "per-rank": <stem>.rank<R>.json each {metadata, cache_data}; "rank-sections": one file {metadata, rank_<R>}
    sources: tuple[str, ...]


RELEASES: dict[str, Release] = {
    "1.2.1": Release(
        "1.2.1", ("autotuner", "inductor", "triton", "torch_extensions", "flashinfer", "cute_dsl", "deep_gemm", "cuda"),
        unified_root=False, autotuner_layout="per-rank",
        sources=("tensorrt_llm/_torch/autotuner.py at b35ac1b64368513d215c57d2ed01d62d910df8da (the version the source "
                 "index holds; not verified to be the v1.2.1 tag): autotune() loads <stem>.rank<R>.json and saves it "
                 "again; save_cache writes {metadata, cache_data}",
                 "tensorrt_llm/_torch/pyexecutor/model_engine.py: cache_path = os.environ.get('TLLM_AUTOTUNER_CACHE_PATH')",
                 "TRTLLM_CACHE_DIR (NVIDIA/TensorRT-LLM#18897) is not in 1.2.1: each variable is set on its own")),
    "1.4.0rc1": Release(
        "1.4.0rc1", tuple(CACHE_KINDS), unified_root=True, autotuner_layout="rank-sections",
        sources=("tensorrt_llm/_bootstrap.py at fc4436a44e5af0e268b6d490467f8bdc34ee5930 (main after #18897; not verified "
                 "to be the v1.4.0rc1 tag): TRTLLM_CACHE_DIR sets the default of every cache variable, TRTLLM_DG_CACHE_DIR added",
                 "tensorrt_llm/_torch/autotuner.py, a later version the index holds (save_cache(file_path, rank) under "
                 "fcntl.flock): one file {metadata, rank_<R>: {...}}; _deserialize_metadata still overwrites")),
}

COMPAT_FIELDS: tuple[CompatField, ...] = (
    CompatField("tensorrt_llm_version", "hard", "the autotuner file records lib_version, and tactics are runner ids of "
                "one release (tensorrt_llm/_torch/autotuner.py); another release is a different set of runners"),
    CompatField("gpus.name", "hard", "the autotuner file records device_name: tactics timed on one GPU model are "
                "wrong for another of the same SM (H100 vs H200); upstream never checks it (#17664 closed unmerged)"),
    CompatField("gpus.sm", "hard", "the autotuner records device_capability, and Triton, FlashInfer, DeepGEMM and "
                "CuTe DSL compile per SM"),
    CompatField("cuda_version", "hard", "torch extensions, FlashInfer's JIT cache and the CUDA PTX cache are built per "
                "CUDA release (flashinfer#5145: a CUDA 13 cache reused by CUDA 12.9 workers)"),
    CompatField("torch_version", "hard", "Inductor's cache key and torch extensions' ABI are per torch release"),
    CompatField("triton_version", "hard", "Triton's cache key includes its version (vllm#41871: a stale cache garbled output)"),
    CompatField("flashinfer_version", "hard", "FlashInfer's JIT cache is per release"),
    CompatField("deep_gemm_version", "hard", "DeepGEMM's JIT cache is per release"),
    CompatField("platform", "hard", "compiled kernels (.so) load only on their own OS and architecture"),
    CompatField("driver_version", "soft", "a driver upgrade invalidates only the CUDA PTX cache (the driver rebuilds "
                "it, correct but slow): re-check, whose cache-used gate sees the recompile"),
    CompatField("glibc_version", "soft", "a torch extension linked against a newer glibc fails with 'GLIBC_2.xx not found'"),
)
FLOORS: tuple[Floor, ...] = CUDA_DRIVER_FLOORS  # the driver >= the CUDA runtime's minimum


def release_for(version: str | None) -> Release | None:
    return RELEASES.get(version or "")


def llm_api_config(profile: BuildProfile) -> dict[str, Any]:
    """The LLM-API arguments (``trtllm-serve --config`` YAML) the caches are built for and served
    with. Every one is a tuning field: the autotuner tunes up to ``max_num_tokens``, CUDA graphs
    are captured per batch size, the KV dtype picks the attention kernels."""
    e = profile.engine
    return {
        "backend": "pytorch", "tensor_parallel_size": e.tp_size, "pipeline_parallel_size": e.pp_size,
        "max_batch_size": e.max_batch_size, "max_num_tokens": e.max_num_tokens or e.max_input_len,
        "max_seq_len": e.max_seq_len, "enable_autotuner": True,
        "kv_cache_config": {"dtype": "fp8" if e.kv_cache_dtype.startswith("fp8") else "auto",
                            "free_gpu_memory_fraction": 0.9},
        "cuda_graph_config": {"max_batch_size": e.max_batch_size, "enable_padding": True},
    }


def cache_environment(release: Release, caches: Path) -> dict[str, str]:
    """The cache variables of ``release``, pointed at ``caches`` (a writable scratch copy). Each is
    set explicitly even where TRTLLM_CACHE_DIR would default it: a variable the host already sets
    would otherwise win over the unified root (upstream uses ``os.environ.setdefault``)."""
    env = {}
    for kind in release.kinds:
        var = CACHE_KINDS[kind][0]
        env[var] = str(caches / (AUTOTUNER_FILE if kind == "autotuner" else kind))
    if release.unified_root:
        env["TRTLLM_CACHE_DIR"] = str(caches)
    return env


def _host_value(host: Fingerprint, path: str) -> Any:
    v = value_at(host.model_dump(mode="json"), path)
    return v[0] if isinstance(v, list) and len(v) == 1 else v


def built_for(kind: str, host: Fingerprint) -> dict[str, Any]:
    """The host values a cache of ``kind`` holds contents for."""
    return {path: _host_value(host, path) for path in CACHE_KINDS[kind][1]}


def _capability(value: Any) -> str | None:
    """``[9, 0]`` (the autotuner's tuple) -> ``"9.0"`` (a fingerprint's SM)."""
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return f"{value[0]}.{value[1]}"
    return None if value is None else str(value)


def autotuner_files(caches: Path, release: Release, world: int) -> dict[int, Path]:
    """Where each rank's autotuner entries are, as ``release`` lays them out."""
    base = caches / AUTOTUNER_FILE
    if release.autotuner_layout == "per-rank":
        return {r: base.with_name(f"{base.stem}.rank{r}.json") for r in range(world)}
    return {r: base for r in range(world)}


def read_autotuner(caches: Path, release: Release, world: int) -> dict[int, tuple[dict[str, Any], int]]:
    """Each rank's ``(metadata, entries)``; a missing or malformed file is an :class:`EngineLoadError`."""
    out = {}
    for rank, path in autotuner_files(caches, release, world).items():
        rel = path.relative_to(caches.parent) if caches.parent in path.parents else path
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise EngineLoadError(str(caches.parent), f"the autotuner cache {rel} is missing") from None
        except (OSError, ValueError) as err:
            raise EngineLoadError(str(caches.parent), f"the autotuner cache {rel} does not parse: {err}") from None
        if not isinstance(data, dict):
            raise EngineLoadError(str(caches.parent), f"the autotuner cache {rel} is not a JSON object")
        section = data.get("cache_data") if release.autotuner_layout == "per-rank" else data.get(f"rank_{rank}")
        meta = data.get("metadata")
        if not isinstance(meta, dict) or not isinstance(section, dict) or not set(AUTOTUNER_METADATA) <= set(meta):
            raise EngineLoadError(str(caches.parent), f"the autotuner cache {rel} has no metadata or no entries for "
                                                      f"rank {rank}")
        out[rank] = (meta, len(section))
    return out


def cache_refusals(bundle_dir: Path, record: dict[str, Any], host: Fingerprint) -> dict[str, tuple[Any, Any]]:
    """``{"<cache>.<field>": (recorded, this host)}`` for every cache whose recorded host differs
    from ``host``: the autotuner from its own file's metadata (what upstream overwrites instead of
    checking), the other caches from the record's ``caches.<kind>.built_for``."""
    release = release_for(record.get("release"))
    if release is None:
        raise EngineLoadError(str(bundle_dir), f"{RECORD} names TensorRT-LLM {record.get('release')!r}, whose cache "
                                               f"layout buildctl does not know (knows {', '.join(RELEASES)})")
    caches = Path(bundle_dir) / CACHES
    out: dict[str, tuple[Any, Any]] = {}
    for rank, (meta, _n) in read_autotuner(caches, release, int(record.get("world_size") or 1)).items():
        for key, path in AUTOTUNER_METADATA.items():
            theirs = _capability(meta.get(key)) if key == "device_capability" else meta.get(key)
            mine = _host_value(host, path)
            if theirs != mine:
                out.setdefault(f"autotuner.{key}", (theirs, mine))
    for kind, entry in sorted((record.get("caches") or {}).items()):
        if kind == "autotuner":
            continue
        if not isinstance(entry, dict):
            raise EngineLoadError(str(bundle_dir), f"{RECORD}: caches.{kind} is not an object")
        for path, theirs in sorted((entry.get("built_for") or {}).items()):
            mine = _host_value(host, path)
            if theirs != mine:
                out[f"{kind}.{path}"] = (theirs, mine)
    return out


def layout_problems(bundle_dir: Path, record: dict[str, Any]) -> list[str]:
    """Caches the record lists that are absent, and cache folders it does not list."""
    release = release_for(record.get("release"))
    caches = Path(bundle_dir) / CACHES
    listed = set(record.get("caches") or {})
    out = []
    for kind in sorted(listed):
        if release is not None and kind not in release.kinds:
            out.append(f"caches/{kind}: TensorRT-LLM {release.version} has no such cache")
        elif kind != "autotuner" and not (caches / kind).is_dir():
            out.append(f"caches/{kind} is missing (the record lists {record['caches'][kind].get('files', '?')} file(s))")
    if caches.is_dir():
        for d in sorted(p.name for p in caches.iterdir()):
            if d not in listed:
                out.append(f"caches/{d}: not a cache the record lists")
    return out


def read_record(bundle_dir: Path) -> dict[str, Any]:
    return read_bundle_record(bundle_dir, RECORD, NAME, BUNDLE_FORMAT, (f"{MODEL}/config.json", CONFIG))


def check_bundle(bundle_dir: Path, record: dict[str, Any], host: Fingerprint) -> None:
    """Every check a reader makes before the runtime sees the bundle: its layout, each cache's
    recorded host against this one (naming the cache and field), then the compat key."""
    problems = layout_problems(bundle_dir, record)
    if problems:
        raise EngineLoadError(str(bundle_dir), "; ".join(problems))
    refused = cache_refusals(bundle_dir, record, host)
    if refused:
        raise IncompatibleTargetError(f"{NAME} bundle {bundle_dir}: a cache was made for another host", refused)
    check_compat_key(bundle_dir, record, host, NAME)


def cache_files(caches: Path) -> set[str]:
    """Every JIT cache file under ``caches`` (the autotuner file excluded: every start saves it)."""
    if not caches.is_dir():
        return set()
    out = set()
    for dirpath, _dirs, files in os.walk(caches):
        for name in files:
            rel = os.path.relpath(os.path.join(dirpath, name), caches)
            if not rel.startswith("autotuner/") and not name.endswith(".lock"):
                out.add(rel)
    return out


def cache_evidence(record: dict[str, Any], caches: Path, before: set[str], log_text: str) -> dict[str, Any]:
    """Whether the start that ran on ``caches`` (a scratch copy holding ``before``) used the bundle:
    it loaded the autotuner file (its log line), tuned no entry the bundle lacked, and compiled no
    new JIT file."""
    release = RELEASES[record["release"]]
    reasons = []
    if "[Autotuner] Loading cache from" not in log_text:
        reasons.append("the runtime did not load the autotuner cache (no '[Autotuner] Loading cache from' line)")
    try:
        now = read_autotuner(caches, release, int(record.get("world_size") or 1))
        tuned = {r: n - int(record["autotuner_entries"].get(str(r), 0)) for r, (_m, n) in now.items()}
        if any(v > 0 for v in tuned.values()):
            reasons.append(f"the autotuner tuned {sum(v for v in tuned.values() if v > 0)} new entr(ies): the "
                           "bundle's tactics did not cover this start's shapes")
    except EngineLoadError as err:
        reasons.append(err.detail)
    new_files = sorted(cache_files(caches) - before)
    if new_files:
        kinds = sorted({f.split("/", 1)[0] for f in new_files})
        reasons.append(f"the runtime JIT-compiled {len(new_files)} new file(s) in {', '.join(kinds)}")
    return {"cache_used": not reasons, "reason": "; ".join(reasons) or None, "new_files": len(new_files)}


def serving_plan(bundle_dir: Path, record: dict[str, Any], caches: Path) -> dict[str, Any]:
    """What ``trtllm-serve`` needs to use the installed bundle: working directory (the bundle: the
    model is the relative path ``model``), environment and command (``buildctl node env``)."""
    release = RELEASES[record["release"]]
    env = {**record["env"], **cache_environment(release, caches)}
    return {"cwd": str(bundle_dir), "env": env, "engine_args": dict(record["llm_args"]),
            "command": ["trtllm-serve", MODEL, "--backend", "pytorch", "--config", CONFIG]}


def _yaml(data: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=True)


class TrtllmTorchBackend:
    name: ClassVar[str] = NAME

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @staticmethod
    def tool_version(fingerprint: Fingerprint) -> str | None:
        return fingerprint.tensorrt_llm_version

    @staticmethod
    def gpus_needed(profile: BuildProfile) -> int:
        return profile.engine.world_size

    compat: ClassVar[tuple[CompatField, ...]] = COMPAT_FIELDS
    floors: ClassVar[tuple[Floor, ...]] = FLOORS
    engine_format: ClassVar[int] = BUNDLE_FORMAT
    records_host: ClassVar[bool] = True

    @staticmethod
    def legacy_compat_fields(fingerprint: Fingerprint) -> dict[str, Any]:
        """trtllm-torch came after compat-key schema 1: its "legacy" key is the backend's name over
        its hard fields (never a current key, so never a match)."""
        return {"tensorrt_llm": fingerprint.tensorrt_llm_version, "sm": value_at(fingerprint.model_dump(mode="json"), "gpus.sm")}

    @staticmethod
    def recognises(engine_dir: Path) -> bool:
        return names_backend(engine_dir, RECORD, NAME)

    @staticmethod
    def check_engine_spec(spec: EngineSpec) -> None:
        """trtllm-torch rules of a profile's engine section."""
        for name, rule in (("aoti", "aoti-options-aoti-only"), ("plugins", "plugins-trtllm-only"),
                           ("calibration", "calibration-trtllm-only"), ("vllm", "vllm-options-vllm-only")):
            if getattr(spec, name) is not None:
                raise rule_error(name, rule, "{n} options do not apply to backend trtllm-torch", n=name)
        if spec.quantization not in ("none", "fp8"):
            raise rule_error("quantization", "trtllm-torch-quantization",
                             "quantization {q!r}: a trtllm-torch bundle serves a checkpoint as it is, none or a ModelOpt "
                             "fp8 checkpoint (quantize with ModelOpt first)", q=spec.quantization)

    def unmet_requirements(self, profile: BuildProfile, fingerprint: Fingerprint) -> list[str]:
        out = []
        v = fingerprint.tensorrt_llm_version
        if v is None:
            return ["TensorRT-LLM: not installed for the serving interpreter"]
        if release_for(v) is None:
            out.append(f"TensorRT-LLM {v}: buildctl knows the cache layouts of {', '.join(RELEASES)} only")
        if fingerprint.gpu_count < profile.engine.world_size:
            out.append(f"{profile.engine.world_size} GPU(s) (tp_size * pp_size): this host has {fingerprint.gpu_count}")
        return out

    def _python(self) -> str:
        return self.settings.trtllm_python or sys.executable

    def build(self, profile: BuildProfile, model_dir: Path, out_dir: Path, fingerprint: Fingerprint,
              log_path: Path, *, model_digest: str | None = None) -> BuildResult:
        out_dir = Path(out_dir)
        if out_dir.exists():
            raise EngineBuildError(NAME, "error", f"output directory {out_dir} already exists")
        problems = self.unmet_requirements(profile, fingerprint)
        if problems:
            raise EngineBuildError(NAME, "error", "; ".join(problems))
        release = RELEASES[str(fingerprint.tensorrt_llm_version)]
        if profile.engine.quantization == "fp8":
            qc = Path(model_dir) / "hf_quant_config.json"
            try:
                algo = json.loads(qc.read_text()).get("quantization", {}).get("quant_algo")
            except (OSError, ValueError, AttributeError):
                algo = None
            if algo != "FP8":
                raise EngineBuildError(NAME, "error", f"quantization fp8 needs a ModelOpt FP8 checkpoint: {qc} "
                                                      f"{'says ' + repr(algo) if algo else 'is missing or unreadable'}")
        work = out_dir.parent / f".build-{uuid.uuid4().hex}"
        bundle = work / "bundle"
        (work / "tmp").mkdir(parents=True)
        llm_args = llm_api_config(profile)
        world = profile.engine.world_size
        try:
            shutil.copytree(model_dir, bundle / MODEL, copy_function=shutil.copyfile)
            (bundle / CONFIG).write_text(_yaml(llm_args))
            caches = bundle / CACHES
            for kind in release.kinds:
                (caches / kind).mkdir(parents=True)
            e = profile.engine
            spec = {"llm_args": llm_args, "warmup": [[1, 8], [e.max_batch_size, 8],
                                                     [1, max(1, min(e.max_input_len, e.max_seq_len - 2))]]}
            (work / "spec.json").write_text(json.dumps(spec))
            env = {**os.environ, **cache_environment(release, caches), "TMPDIR": str(work / "tmp"),
                   "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
            start = time.monotonic()
            cmd = (self._python(), "-m", "buildctl.engines.trtllm_torch.child", "warm", str(work / "spec.json"),
                   str(work / "result.json"))
            run_step(NAME, "trtllm-torch warm-up run", cmd, log_path=log_path, timeout_s=e.build_timeout_s, env=env,
                     cwd=bundle, memory_limit_mb=e.build_memory_limit_mb)
            try:
                result = json.loads((work / "result.json").read_text())
            except (OSError, ValueError):
                raise EngineBuildError(NAME, "incomplete", "the warm-up run exited 0 but wrote no result",
                                       log_path=str(log_path)) from None
            for d in sorted(caches.iterdir()):  # a manifest lists files only
                if d.is_dir() and not any(d.rglob("*")):
                    d.rmdir()
            tuned = read_autotuner(caches, release, world)
            caches_record = {kind: {"env": CACHE_KINDS[kind][0], "built_for": built_for(kind, fingerprint),
                                    "files": sum(1 for p in (caches / kind).rglob("*") if p.is_file())}
                             for kind in release.kinds if (caches / kind).is_dir()}
            record = {
                "format": BUNDLE_FORMAT, "backend": NAME, "runtime": "tensorrt_llm", "release": release.version,
                "profile": profile.name, "profile_hash": profile.build_hash(),
                "compat_key": fingerprint.compat_key(NAME), "compat_fields": fingerprint.compat_fields(NAME),
                "versions": {"tensorrt_llm": fingerprint.tensorrt_llm_version, "torch": fingerprint.torch_version,
                             "triton": fingerprint.triton_version, "flashinfer": fingerprint.flashinfer_version,
                             "deep_gemm": fingerprint.deep_gemm_version, "cuda": fingerprint.cuda_version},
                "device": {"name": _host_value(fingerprint, "gpus.name"), "sm": _host_value(fingerprint, "gpus.sm")},
                "world_size": world, "llm_args": llm_args, "config": CONFIG, "model_path": MODEL,
                "env": {"HF_HUB_OFFLINE": "1"}, "caches": caches_record,
                "autotuner_entries": {str(r): n for r, (_m, n) in tuned.items()},
                "model_digest": model_digest, "warmup": spec["warmup"],
                "warm_up_run_startup_s": result.get("startup_s"), "sources": list(release.sources),
            }
            refused = cache_refusals(bundle, record, fingerprint)
            if refused:
                detail = ", ".join(f"{k}: {a!r} in the cache, {b!r} in the build's fingerprint" for k, (a, b) in refused.items())
                raise EngineBuildError(NAME, "incomplete", f"the warm-up ran on another host than the build was asked "
                                                           f"for: {detail}", log_path=str(log_path))
            (bundle / RECORD).write_text(json.dumps(record, indent=1, sort_keys=True))
            os.rename(bundle, out_dir)
            wall = time.monotonic() - start
        finally:
            shutil.rmtree(work, ignore_errors=True)
        files = sorted(os.path.relpath(os.path.join(d, f), out_dir) for d, _s, fs in os.walk(out_dir) for f in fs)
        return BuildResult(engine_dir=out_dir, files=files, log_path=log_path, wall_s=wall,
                           tool_versions={"tensorrt_llm": fingerprint.tensorrt_llm_version,
                                          "torch": fingerprint.torch_version}, commands=(cmd,))

    def load(self, engine_dir: Path, *, cold: bool = False) -> "TorchBundleRunner":
        engine_dir = Path(engine_dir)
        record = read_record(engine_dir)
        check_bundle(engine_dir, record, host_fingerprint(self.settings))
        return TorchBundleRunner(engine_dir, record, python=self._python(), cold=cold)

    def warm_start(self, engine_dir: Path, first: "TorchBundleRunner", pairs: int,
                   say: Any = lambda _: None) -> dict[str, Any]:
        """The start-up check of validation, as the vllm bundle's: ``first`` and ``pairs``
        interleaved cold (empty caches) and warm starts; every warm start must have used the caches."""
        found = paired_starts(lambda cold: self.load(Path(engine_dir), cold=cold), first, pairs, say)
        return {**found,
                "checked": [f"{1 + pairs} warm starts from a scratch copy of the installed bundle's caches loaded the "
                            "autotuner file, tuned no new entry and JIT-compiled no new file",
                            f"{pairs} cold starts (empty caches) against {pairs} warm starts, interleaved",
                            "each cache's recorded host against this host (the check upstream lacks) before every start"]}

    def check_tree(self, engine_dir: Path, fingerprint: Fingerprint) -> None:
        check_bundle(Path(engine_dir), read_record(Path(engine_dir)), fingerprint)

    def preflight(self, engine_dir: Path) -> None:
        runner = self.load(engine_dir)
        try:
            runner.generate([[1, 5, 9]], max_tokens=2, top_logprobs=1)
        finally:
            runner.close()


class TorchBundleRunner:
    """A bundle served by TensorRT-LLM's LLM API in a child process (:mod:`.child`), from a scratch
    copy of its caches. ``evidence`` says whether the start used them (:func:`cache_evidence`)."""

    name = NAME

    def __init__(self, bundle_dir: Path, record: dict[str, Any], *, python: str = sys.executable,
                 cold: bool = False) -> None:
        self.bundle_dir = Path(bundle_dir)
        self.record = record
        self._tmp = Path(tempfile.mkdtemp(prefix="buildctl-trtllm-torch-"))
        self._child: ChildRuntime | None = None
        try:
            caches = self._tmp / "caches"
            if cold:
                caches.mkdir()
                for kind in RELEASES[record["release"]].kinds:
                    (caches / kind).mkdir()
            else:
                scratch_caches(self.bundle_dir, caches)
            before = cache_files(caches)
            plan = serving_plan(self.bundle_dir, record, caches)
            spec = self._tmp / "spec.json"
            spec.write_text(json.dumps({"llm_args": plan["engine_args"]}))
            self.log_path = self._tmp / "trtllm.log"
            t0 = time.monotonic()
            self._child = ChildRuntime(
                [python, "-m", "buildctl.engines.trtllm_torch.child", "serve", str(spec)], cwd=self.bundle_dir,
                env={**os.environ, **plan["env"], "PYTHONUNBUFFERED": "1"}, log_path=self.log_path,
                what="the TensorRT-LLM child", engine_dir=self.bundle_dir)
            first = self._child.read()
            if first is None or "ready" not in first:
                detail = (first or {}).get("error") or f"the TensorRT-LLM child exited ({self._child.tail()})"
                raise EngineLoadError(str(self.bundle_dir), f"TensorRT-LLM did not start from the bundle: {detail}")
            self.startup_s = float(first.get("startup_s") or (time.monotonic() - t0))
            self.evidence = cache_evidence(record, caches, before, self.log_path.read_text(errors="replace"))
        except BaseException:
            self.close()
            raise

    def generate(self, prompts: list[list[int]], max_tokens: int, top_logprobs: int) -> list[Generation]:
        if self._child is None:
            raise EngineLoadError(str(self.bundle_dir), "the bundle's runtime was closed")
        self._child.send({"op": "generate", "prompts": prompts, "max_tokens": max_tokens, "top_logprobs": top_logprobs})
        return [Generation(token_ids=[int(t) for t in g["token_ids"]],
                           top_logprobs=[{int(t): float(lp) for t, lp in step} for step in g["top_logprobs"]])
                for g in self._child.answer()["generations"]]

    def stream(self, prompts: list[list[int]], max_tokens: int, concurrency: int) -> Iterator[TokenEvent]:
        """Requests in waves of ``concurrency``, each token stamped when its wave returns (the LLM
        API's ``generate`` is not streamed here; TTFT on this runner is per wave)."""
        for lo in range(0, len(prompts), max(1, concurrency)):
            wave = prompts[lo:lo + max(1, concurrency)]
            t0 = time.perf_counter()
            for i in range(len(wave)):
                yield TokenEvent(lo + i, None, t0)
            gens = self.generate(wave, max_tokens, 0)
            t = time.perf_counter()
            for i, g in enumerate(gens):
                for tok in g.token_ids:
                    yield TokenEvent(lo + i, tok, t)

    def close(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            child.close()
        shutil.rmtree(self._tmp, ignore_errors=True)
