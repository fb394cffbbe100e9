"""Installed size of each extra: a fresh venv per install set, the wheel built from this checkout.

    python -m benchmarks.install_sizes

Sizes are of the venv's site-packages (``du``), with the empty venv's own pip subtracted, so a
row is what ``pip install buildctl[...]`` adds. The ``cpu`` row removes the CUDA builds of
torchvision/torchaudio/torchcodec and triton afterwards, as ``make install`` does. ``trtllm`` and
``vllm`` (the GPU packages) cannot be installed on this machine: the TensorRT-LLM wheel on PyPI
is a stub that downloads from NVIDIA's index, which is not reachable here.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import finish, table

REPO = Path(__file__).resolve().parent.parent
SETS = [
    ("base (node agent + store)", ""),
    ("orchestration", "orchestration"),
    ("cpu", "cpu"),
    ("test", "test"),
    ("bench", "bench"),
    ("make install (orchestration,cpu,test,bench)", "orchestration,cpu,test,bench"),
]
MIB = 2 ** 20


def du(path: Path) -> int:
    return int(subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def main(argv: list[str] | None = None) -> int:
    with tempfile.TemporaryDirectory(prefix="buildctl-bench-install-") as d:
        root = Path(d)
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(root / "dist"), str(REPO)],
                       check=True)
        wheel = next((root / "dist").glob("buildctl-*.whl"))
        subprocess.run([sys.executable, "-m", "venv", str(root / "empty")], check=True)
        empty = du(site_packages(root / "empty"))
        rows, sizes = [], {}
        for name, extras in SETS:
            venv = root / f"v-{len(sizes)}"
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            py = venv / "bin" / "python"
            t0 = time.monotonic()
            spec = f"{wheel}[{extras}]" if extras else str(wheel)
            subprocess.run([str(py), "-m", "pip", "install", "-q", spec], check=True)
            if "cpu" in extras.split(","):
                subprocess.run([str(py), "-m", "pip", "uninstall", "-q", "-y", "torchvision", "torchaudio",
                                "torchcodec", "triton"], check=False)
            secs = time.monotonic() - t0
            size = du(site_packages(venv)) - empty
            has = subprocess.run([str(py), "-c", "import importlib.util as u; print(','.join(m for m in "
                                  "('prefect', 'torch', 'vllm', 'boto3') if u.find_spec(m)))"],
                                 capture_output=True, text=True).stdout.strip()
            sizes[name] = {"mib": round(size / MIB, 1), "install_s": round(secs, 1), "has": has}
            rows.append([name, f"pip install buildctl{'[' + extras + ']' if extras else ''}", f"{size / MIB:,.0f}",
                         has or "-", f"{secs:.0f}"])
            subprocess.run(["rm", "-rf", str(venv)], check=True)
    text = table("installed size per extra (site-packages, MiB; one fresh venv each)",
                 ["install set", "command", "MiB", "of prefect/torch/vllm/boto3", "install s"], rows)
    text += ("\n\ntrtllm and vllm (GPU) are not installable here (no GPU, and TensorRT-LLM's PyPI wheel "
             "downloads from NVIDIA's index); pip's cache was warm, so install times are lower bounds.")
    finish("install_sizes", text, {"sets": sizes})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
