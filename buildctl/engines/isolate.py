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

from buildctl.core import logtail
from buildctl.engines.errors import EngineBuildError

TAIL_LINES = 30


def log_tail(path: Path, lines: int = TAIL_LINES) -> str:
    """A build step's last ``lines`` log lines, from its last 64 KiB (:func:`buildctl.core.logtail.log_tail`)."""
    return logtail.log_tail(path, lines, window=64 * 1024)


MEMORY_POLL_S = 0.2


def group_rss_bytes(pgid: int) -> int:
    """Resident memory of every process in group ``pgid`` (Linux /proc; 0 where unreadable).

    The memory limit watches resident memory, not address space: CUDA reserves tens of GiB of
    virtual address space per process at start-up, so an RLIMIT_AS that a CPU-side runaway would
    trip also kills every healthy GPU build."""
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if int(fields[2]) != pgid:  # fields after the command: state, ppid, pgrp, ...
                continue
            with open(f"/proc/{entry.name}/statm", "rb") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            continue
    return total


def _wait(proc: subprocess.Popen, timeout_s: float, memory_limit_mb: int | None) -> tuple[int, int | None]:
    """Wait for ``proc``; with a memory limit, poll the group's RSS and return (rc, peak RSS over
    the limit) when it passed the limit (the caller kills the group). Raises TimeoutExpired."""
    if memory_limit_mb is None:
        return proc.wait(timeout=timeout_s), None
    limit = memory_limit_mb * 1024 * 1024
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return proc.wait(timeout=MEMORY_POLL_S), None
        except subprocess.TimeoutExpired:
            rss = group_rss_bytes(proc.pid)
            if rss > limit:
                return -1, rss
            if time.monotonic() >= deadline:
                raise


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
                                    env=dict(env) if env is not None else None, cwd=cwd, start_new_session=True)
        except OSError as err:
            raise EngineBuildError(backend, "error", f"{step}: cannot start {cmd[0]}: {err.strerror or err}",
                                   log_path=str(log_path)) from None
        try:
            rc, over = _wait(proc, timeout_s, memory_limit_mb)
            if over is not None:
                _kill_group(proc)
                log.write(f"\n[buildctl] {step} killed: resident memory {over >> 20} MiB passed the "
                          f"{memory_limit_mb} MiB limit\n".encode())
                log.flush()
                raise EngineBuildError(backend, "memory", f"{step} used {over >> 20} MiB resident memory, over its "
                                       f"{memory_limit_mb} MiB limit (build_memory_limit_mb)",
                                       log_path=str(log_path), log_tail=log_tail(log_path))
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
