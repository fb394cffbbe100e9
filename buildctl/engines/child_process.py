"""What the bundle backends (vllm, trtllm-torch) share: the bundle record (read, recognised, its
compat key checked), a runtime in a child process that speaks one JSON object per line, and the
writable scratch copy of a bundle's caches it starts from.

A runtime keeps per-process state and writes into its caches at start, so a bundle is served
from its own child, on a fresh copy of ``caches/``; the verified install stays read-only and
byte-identical. Standard library only.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from buildctl.engines.errors import EngineLoadError, IncompatibleTargetError

if TYPE_CHECKING:
    from buildctl.engines.fingerprint import Fingerprint

CACHES = "caches"


def names_backend(bundle_dir: Path, record_name: str, backend: str) -> bool:
    """Whether ``bundle_dir`` holds a record that names ``backend`` (a backend's ``recognises``)."""
    p = Path(bundle_dir) / record_name
    if not p.is_file():
        return False
    try:
        return json.loads(p.read_text()).get("backend") == backend
    except (OSError, ValueError, AttributeError):
        return False


def read_bundle_record(bundle_dir: Path, record_name: str, backend: str, fmt: int, needs: tuple[str, ...]) -> dict[str, Any]:
    """The bundle's record, of ``backend`` and format ``fmt``, with every file of ``needs`` present;
    anything else is an :class:`EngineLoadError` naming what is wrong."""
    p = Path(bundle_dir) / record_name
    try:
        record = json.loads(p.read_text())
    except FileNotFoundError:
        raise EngineLoadError(str(bundle_dir), f"{record_name} is missing") from None
    except (OSError, ValueError) as err:
        raise EngineLoadError(str(bundle_dir), f"{record_name} unreadable: {err}") from None
    if not isinstance(record, dict) or record.get("format") != fmt or record.get("backend") != backend:
        raise EngineLoadError(str(bundle_dir), f"{record_name} is not a {backend} bundle record of a known format")
    for need in needs:
        if not (Path(bundle_dir) / need).is_file():
            raise EngineLoadError(str(bundle_dir), f"{need} is missing")
    return record


def check_compat_key(bundle_dir: Path, record: dict[str, Any], host: "Fingerprint", backend: str) -> None:
    """Refuse a bundle built for another compat key, naming every hard field that differs."""
    if record.get("compat_key") == host.compat_key(backend):
        return
    mine, theirs = host.compat_fields(backend), dict(record.get("compat_fields") or {})
    diff = {k: (theirs.get(k), mine[k]) for k in mine if theirs.get(k) != mine[k]} or {
        "compat_key": (record.get("compat_key"), host.compat_key(backend))}
    raise IncompatibleTargetError(f"{backend} bundle {bundle_dir} was built for another host", diff)


def scratch_caches(bundle_dir: Path, into: Path) -> Path:
    """A writable copy of the bundle's ``caches/`` at ``into`` (new files, owner-writable)."""
    src = Path(bundle_dir) / CACHES
    if src.is_dir():
        shutil.copytree(src, into, copy_function=shutil.copyfile)
    else:
        into.mkdir(parents=True)
    return into


class ChildRuntime:
    """A runtime serving over the stdin and stdout of a child process in its own session; its own
    output goes to ``log_path``. ``what`` names it in errors ("the vLLM child")."""

    def __init__(self, argv: list[str], *, cwd: Path, env: dict[str, str], log_path: Path, what: str,
                 engine_dir: Path) -> None:
        self.log_path, self.what, self.engine_dir = Path(log_path), what, Path(engine_dir)
        with open(self.log_path, "ab") as logf:
            self._proc: subprocess.Popen | None = subprocess.Popen(
                argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=logf, text=True,
                start_new_session=True)

    def tail(self) -> str:
        """The last lines of the child's log, for an error message."""
        try:
            return " | ".join(self.log_path.read_text(errors="replace").strip().splitlines()[-3:])[-400:]
        except OSError:
            return "no log"

    def read(self) -> dict[str, Any] | None:
        """The next line out, or None when the child has exited."""
        assert self._proc is not None and self._proc.stdout is not None
        line = self._proc.stdout.readline()
        return json.loads(line) if line else None

    def send(self, request: dict[str, Any]) -> None:
        if self._proc is None or self._proc.stdin is None:
            raise EngineLoadError(str(self.engine_dir), f"{self.what} was closed")
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()

    def answer(self) -> dict[str, Any]:
        """The next line out; the child's error, or its exit, is an :class:`EngineLoadError`."""
        out = self.read()
        if out is None or "error" in out:
            raise EngineLoadError(str(self.engine_dir), f"{self.what} failed: {(out or {}).get('error') or self.tail()}")
        return out

    def close(self) -> None:
        """Ask the child to close, then kill its process group whatever it did."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.poll() is None and proc.stdin is not None:
                proc.stdin.write(json.dumps({"op": "close"}) + "\n")
                proc.stdin.flush()
            proc.wait(timeout=60)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()


def paired_starts(start: Callable[[bool], Any], first: Any, pairs: int, say: Callable[[str], None]) -> dict[str, Any]:
    """The start-up check of validation: ``first`` (the candidate's own start) and ``pairs``
    interleaved cold (``start(True)``: empty caches) and warm (``start(False)``: the bundle's)
    starts, each in its own child. Every warm start must have used the caches (its runner's
    ``evidence``). Returns the cold and warm engine-ready seconds and the first miss."""
    misses = [] if first.evidence["cache_used"] else [first.evidence["reason"]]
    cold: list[float] = []
    warm: list[float] = []
    for i in range(pairs):
        for kind in (("cold", "warm") if i % 2 == 0 else ("warm", "cold")):
            runner = start(kind == "cold")
            try:
                (cold if kind == "cold" else warm).append(round(runner.startup_s, 3))
                if kind == "warm" and not runner.evidence["cache_used"]:
                    misses.append(runner.evidence["reason"])
            finally:
                runner.close()
            say(f"warm start: pair {i + 1}/{pairs}, {kind} engine ready in {(cold if kind == 'cold' else warm)[-1]:.1f} s")
    return {"cache_used": not misses, "reason": misses[0] if misses else None, "cold_s": cold, "warm_s": warm}
