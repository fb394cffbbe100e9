"""Isolated build steps (buildctl.engines.isolate): wall time, log tails, exit classification,
memory limit, timeouts that ask before they kill, and stragglers. Small shell commands; fast."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time

import pytest

import buildctl.engines.isolate as iso
from buildctl.engines.errors import EngineBuildError
from buildctl.engines.isolate import group_rss_bytes, log_tail, run_step


def sh(script: str) -> list[str]:
    return ["sh", "-c", script]


def step(tmp_path, script: str, **kw) -> float:
    kw.setdefault("timeout_s", 30)
    return run_step("aoti", "compile", sh(script), log_path=tmp_path / "logs" / "deep" / "build.log", **kw)


def test_a_step_returns_its_wall_time_and_appends_its_output(tmp_path):
    t0 = time.monotonic()
    wall = step(tmp_path, "sleep 0.3; echo one")
    assert 0.3 <= wall <= time.monotonic() - t0
    step(tmp_path, "echo two")  # the log directory exists now: appended
    text = (tmp_path / "logs" / "deep" / "build.log").read_text()
    assert text.splitlines() == ["$ sh -c sleep 0.3; echo one", "one", "$ sh -c echo two", "two"]


def test_the_environment_is_passed_or_inherited(tmp_path, monkeypatch):
    monkeypatch.setenv("BUILDCTL_ISOLATE_PROBE", "inherited")
    step(tmp_path, 'echo "[$BUILDCTL_ISOLATE_PROBE]"')
    step(tmp_path, 'echo "[$BUILDCTL_ISOLATE_PROBE]"', env={"PATH": os.environ["PATH"], "BUILDCTL_ISOLATE_PROBE": "given"})
    lines = (tmp_path / "logs" / "deep" / "build.log").read_text().splitlines()
    assert "[inherited]" in lines and "[given]" in lines


def test_exit_status_and_signals_are_classified(tmp_path):
    with pytest.raises(EngineBuildError) as exc:
        step(tmp_path, "echo failing; exit 3")
    assert (exc.value.kind, exc.value.returncode, exc.value.signal) == ("exit", 3, None)
    assert exc.value.log_tail.endswith("failing")
    # SIGHUP is signal 1, the boundary of `rc < 0`. A step inherits ignored dispositions, and
    # under `nohup` a shell's `kill -HUP $$` did nothing (sh cannot reset a signal ignored on
    # entry), so the step restores the default in Python before it signals itself.
    for sig in (signal.SIGHUP, signal.SIGSEGV):
        with pytest.raises(EngineBuildError) as exc:
            step(tmp_path, f"exec {sys.executable} -c 'import os, signal; signal.signal({int(sig)}, signal.SIG_DFL); "
                           f"os.kill(os.getpid(), {int(sig)})'")
        assert (exc.value.kind, exc.value.signal, exc.value.returncode) == ("crashed", int(sig), -int(sig))
        assert f"killed by {sig.name}" in str(exc.value)


def test_a_step_that_cannot_start(tmp_path):
    with pytest.raises(EngineBuildError) as exc:
        run_step("aoti", "compile", ["/nonexistent/tool", "--flag"], log_path=tmp_path / "b.log", timeout_s=5)
    assert exc.value.kind == "error"
    assert exc.value.detail == "compile: cannot start /nonexistent/tool: No such file or directory"


def test_a_timeout_asks_the_group_to_stop_before_killing_it(tmp_path):
    script = 'trap "echo got TERM; exit 1" TERM; sleep 30 & wait'
    t0 = time.monotonic()
    with pytest.raises(EngineBuildError) as exc:
        step(tmp_path, script, timeout_s=1)
    assert exc.value.kind == "timeout" and time.monotonic() - t0 < 15
    lines = (tmp_path / "logs" / "deep" / "build.log").read_text().splitlines()
    assert "got TERM" in lines  # the step's own output line (the command line echoed above it also says it)
    assert "[buildctl] compile killed after 1s timeout" in lines


def test_a_step_that_ignores_sigterm_is_killed_after_its_grace(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(EngineBuildError) as exc:
        step(tmp_path, 'trap "" TERM; sleep 60', timeout_s=1)
    assert exc.value.kind == "timeout" and time.monotonic() - t0 < 20  # 1 s, then 5 s of grace, then SIGKILL


def test_stragglers_that_ignore_sigterm_are_killed_when_the_step_exits(tmp_path):
    pidfile = tmp_path / "straggler.pid"
    step(tmp_path, f'(trap "" TERM; echo $(sh -c "echo \\$PPID") > {pidfile}.tmp; mv {pidfile}.tmp {pidfile}; '
                   f'exec sleep 60) & while [ ! -s {pidfile} ]; do sleep 0.05; done; exit 0')
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        raise AssertionError("a straggler that ignores SIGTERM outlived its step")


MiB = 1024 * 1024


def test_the_memory_limit_is_a_strict_bound_in_mib(tmp_path, monkeypatch):
    monkeypatch.setattr(iso, "group_rss_bytes", lambda pgid: 100 * MiB)
    step(tmp_path, "sleep 0.5", memory_limit_mb=100)  # at the limit: allowed
    monkeypatch.setattr(iso, "group_rss_bytes", lambda pgid: 100 * MiB + 1)
    with pytest.raises(EngineBuildError) as exc:
        step(tmp_path, "sleep 5", memory_limit_mb=100)
    assert exc.value.kind == "memory" and "used 100 MiB resident memory, over its 100 MiB limit" in str(exc.value)
    monkeypatch.setattr(iso, "group_rss_bytes", lambda pgid: 300 * MiB)
    with pytest.raises(EngineBuildError) as exc:
        step(tmp_path, "sleep 5", memory_limit_mb=299)
    assert "used 300 MiB" in str(exc.value)
    assert "compile killed: resident memory 300 MiB passed the 299 MiB limit" in (
        tmp_path / "logs" / "deep" / "build.log").read_text()


def test_group_rss_counts_the_group_and_skips_what_it_cannot_read(monkeypatch):
    # 20 MB resident, and 1 GiB of address space never touched: resident memory is what counts
    # (its name has a ')' in it, as /proc/PID/stat shows it: the command is parsed from the last ')')
    child = subprocess.Popen([sys.executable, "-c", "import mmap, time; open('/proc/self/comm', 'w').write('x) y'); "
                              "b = bytearray(20_000_000); m = mmap.mmap(-1, 1 << 30); print('ready', flush=True); "
                              "time.sleep(60)"], process_group=0, stdout=subprocess.PIPE, text=True)  # own group
    try:
        assert child.stdout.readline().strip() == "ready"  # allocated, however busy the machine
        rss = group_rss_bytes(child.pid)
        assert 20_000_000 <= rss < 500 * MiB
        assert group_rss_bytes(2**22 + 12345) == 0  # no such group
        real_open = open
        bad = iter([OSError("gone"), b"no parenthesis", b"1 (x) S 1 notanint 1"])

        def flaky(path, mode="r", *a, **k):
            if str(path).startswith("/proc/") and str(path).endswith("/stat") and f"/{child.pid}/" not in str(path):
                item = next(bad, None)
                if isinstance(item, Exception):
                    raise item
                if item is not None:
                    return io.BytesIO(item)
            return real_open(path, mode, *a, **k)

        monkeypatch.setattr(iso, "open", flaky, raising=False)
        assert group_rss_bytes(child.pid) >= 20_000_000
    finally:
        child.kill()
        child.wait()


def test_log_tail_reads_the_last_64_kib(tmp_path):
    p = tmp_path / "log"
    lines = [f"{i:04d}" + "x" * 94 for i in range(1000)]  # 98 characters + newline each
    p.write_text("\n".join(lines) + "\n")
    data = p.read_bytes()
    got = log_tail(p, 10_000).splitlines()
    assert got == data[len(data) - 65536:].decode().splitlines()
    assert len(got) == 662 and got[-1] == lines[-1]
    assert log_tail(p, 3).splitlines() == lines[-3:]
    assert log_tail(p).splitlines() == lines[-30:]  # 30 by default
    small = tmp_path / "small"
    small.write_text("first\nsecond\n")
    assert log_tail(small) == "first\nsecond"
    assert log_tail(tmp_path / "missing") == ""
