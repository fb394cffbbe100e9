"""#30 item 3: a long build is never silent. While a backend builds, its log's new lines go to
the run's logger every few seconds (whole lines; the last partial one at the end); publish says
files, bytes and MB/s."""

from __future__ import annotations

import threading
import time

from buildctl.core.logtail import LOG_TAIL_LINES, log_tail, tailing


def test_a_builds_log_reaches_the_logger_while_it_runs(tmp_path):
    log = tmp_path / "build.log"
    log.write_text("")
    said: list[tuple[float, str]] = []
    t0 = time.monotonic()
    seen_during = threading.Event()

    def say(line: str) -> None:
        said.append((time.monotonic() - t0, line))
        seen_during.set()

    with tailing(log, say, every_s=0.1):
        with open(log, "a") as f:
            f.write("[1/3] converting the checkpoint\n")
            f.flush()
            assert seen_during.wait(5), "nothing was passed on while the build ran"
            f.write("[2/3] building rank 0\n[3/3] half a line")
    lines = [line for _, line in said]
    assert lines == ["build log: [1/3] converting the checkpoint", "build log: [2/3] building rank 0",
                     "build log: [3/3] half a line"]


def test_a_flood_of_lines_is_capped_and_counted(tmp_path):
    log = tmp_path / "build.log"
    log.write_text("")
    said: list[str] = []
    log.write_text("".join(f"step {i}\n" for i in range(500)))  # all there before the first look: one batch
    with tailing(log, said.append, every_s=0.05):
        time.sleep(0.3)
    assert len(said) <= LOG_TAIL_LINES + 1 and said[0].endswith(f"({500 - LOG_TAIL_LINES} lines more in {log})")
    assert said[-1] == "build log: step 499"
    assert log_tail(log, 3) == "step 497\nstep 498\nstep 499" and log_tail(tmp_path / "none") == ""


def test_only_the_validators_phase_lines_are_passed_on(tmp_path):
    """The validator child writes its phases (`[validate] ...`) among library noise on stderr;
    the parent passes on the phases only, as they happen."""
    from buildctl.steps.validate_process import PHASE

    log = tmp_path / "stderr.log"
    log.write_text("")
    said: list[str] = []
    with tailing(log, said.append, every_s=0.05, prefix="", keep=lambda line: line.startswith(PHASE)):
        log.write_text(f"{PHASE}starting the vLLM reference\nINFO vllm: loading weights\n"
                       f"{PHASE}concurrency 4, repetition 3 (C/R): ratio 0.91\n")
        time.sleep(0.3)
    assert said == [f"{PHASE}starting the vLLM reference", f"{PHASE}concurrency 4, repetition 3 (C/R): ratio 0.91"]


def test_pull_says_files_bytes_and_throughput(cli, tmp_path, draft):
    """`buildctl pull` ends with what it moved: files, MB and MB/s, verified."""
    import re

    from buildctl.artifact_store.backends.store import open_store
    from buildctl.artifact_store.promotion import promote

    from ..support.helpers import publish_files, staged

    store = open_store(f"file://{tmp_path / 'store'}")
    aid = publish_files(store, tmp_path / "a", draft, {"config.json": b"{}", "rank0.engine": 3_000_000})
    promote(store, staged(store, aid), "prod")
    code, out, err = cli("--store", store.uri, "pull", "--profile", draft.profile_name, "--channel", "prod", "--dest",
                         tmp_path / "node", "--skip-preflight")
    assert code == 0, err
    assert re.search(r"; 2 files, 3\.0 MB in [\d.]+ s \([\d.]+ MB/s, verified\)", out), out
