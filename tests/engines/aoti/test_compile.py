"""The aoti compile step's two processes: the decode graph's child and the parent's verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from buildctl.engines.aoti import compile as aoti_compile


def _args(tmp_path: Path, model: Path) -> list[str]:
    record = tmp_path / "record.json"
    record.write_text(json.dumps({"dtype": "float32", "max_batch_size": 2, "max_seq_len": 16,
                                  "cache_shape": [1, 2, 2, 1, 16, 4]}))
    return ["--model", str(model), "--out", str(tmp_path / "out"), "--record", str(record)]


def test_a_failed_decode_child_fails_the_step_and_writes_no_record(tmp_path, monkeypatch):
    """The prefill graph compiles here; the decode child (a real process) fails on a model that
    is not there: the step exits non-zero and leaves no engine.json."""
    done = []
    monkeypatch.setattr(aoti_compile, "_compile", lambda name, args, record: done.append(name))
    rc = aoti_compile.main(_args(tmp_path, tmp_path / "no-model"))
    assert done == ["prefill"]
    assert rc != 0
    assert not (tmp_path / "out" / "engine.json").exists()


def test_a_failed_prefill_stops_the_decode_child(tmp_path, monkeypatch):
    started = []
    real_popen = aoti_compile.subprocess.Popen

    def popen(*a, **k):
        proc = real_popen(["sleep", "60"])
        started.append(proc)
        return proc

    def fail(name, args, record):
        raise RuntimeError("prefill failed")

    monkeypatch.setattr(aoti_compile.subprocess, "Popen", popen)
    monkeypatch.setattr(aoti_compile, "_compile", fail)
    with pytest.raises(RuntimeError, match="prefill failed"):
        aoti_compile.main(_args(tmp_path, tmp_path / "model"))
    assert started and started[0].poll() is not None  # killed and reaped, not left running
    assert not (tmp_path / "out" / "engine.json").exists()


def test_both_graphs_succeeding_write_the_record(tmp_path, monkeypatch):
    done = []
    monkeypatch.setattr(aoti_compile, "_compile", lambda name, args, record: done.append(name))
    real_popen = aoti_compile.subprocess.Popen
    monkeypatch.setattr(aoti_compile.subprocess, "Popen", lambda *a, **k: real_popen(["true"]))
    assert aoti_compile.main(_args(tmp_path, tmp_path / "model")) == 0
    assert done == ["prefill"]
    assert json.loads((tmp_path / "out" / "engine.json").read_text())["max_seq_len"] == 16
