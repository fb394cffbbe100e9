"""Run one build step in an isolated subprocess: own process group, timeout, full log on disk.

Builders (trtllm-build, the converters, AOTInductor's compiler) can segfault in their C++
layers; a crash or hang must never take the orchestrator down, and its log must be kept.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Mapping, Sequence

from buildctl.engines.errors import EngineBuildError

TAIL_LINES = 30


def log_tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def _limit_memory(mb: int | None):
    if mb is None:
        return None

    def apply() -> None:
        import resource

        limit = mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return apply


def run_step(backend: str, step: str, cmd: Sequence[str], *, log_path: Path, timeout_s: float,
             env: Mapping[str, str] | None = None, cwd: Path | None = None, memory_limit_mb: int | None = None) -> float:
    """Run ``cmd``, appending its output to ``log_path``. Returns the wall time; raises
    :class:`EngineBuildError` (kind crashed, timeout or exit) on failure."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(log_path, "ab") as log:
        log.write(f"$ {' '.join(cmd)}\n".encode())
        log.flush()
        try:
            proc = subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=dict(env) if env is not None else None, cwd=cwd, start_new_session=True,
                                    preexec_fn=_limit_memory(memory_limit_mb))
        except OSError as err:
            raise EngineBuildError(backend, "error", f"{step}: cannot start {cmd[0]}: {err.strerror or err}",
                                   log_path=str(log_path)) from None
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            log.write(f"\n[buildctl] {step} killed after {timeout_s:.0f}s timeout\n".encode())
            log.flush()
            raise EngineBuildError(backend, "timeout", f"{step} ran past its {timeout_s:.0f}s timeout",
                                   log_path=str(log_path), log_tail=log_tail(log_path)) from None
        except BaseException:
            _kill_group(proc)
            raise
        finally:
            _kill_group(proc, only_stragglers=True)
    wall = time.monotonic() - start
    if rc < 0:
        sig = -rc
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        raise EngineBuildError(backend, "crashed", f"{step} was killed by {name}", returncode=rc, signal=sig,
                               log_path=str(log_path), log_tail=log_tail(log_path))
    if rc != 0:
        raise EngineBuildError(backend, "exit", f"{step} exited with status {rc}", returncode=rc,
                               log_path=str(log_path), log_tail=log_tail(log_path))
    return wall


def _kill_group(proc: subprocess.Popen, only_stragglers: bool = False) -> None:
    """Kill the step's whole process group (compiler children included); its id is the leader's pid."""
    pgid = proc.pid
    try:
        if only_stragglers:
            os.killpg(pgid, signal.SIGKILL)
            return
        os.killpg(pgid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            proc.wait(timeout=10)
    except ProcessLookupError:
        pass
