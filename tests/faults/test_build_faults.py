"""Build-side faults: crash, timeout and out-of-memory. The orchestrator survives, and nothing
partial is published."""

from __future__ import annotations

import json

import pytest

from buildctl.artifact_store.read import list_artifacts
from buildctl.artifact_store.backends.store import open_store
from buildctl.steps import build
from buildctl.core.errors import BuildFailedError
from buildctl.engines.profile import load_profile, parse_profile
from buildctl.steps.context import Context

from ..support.helpers import settings
from ..support.trtllm_kit import calib, fake_tools, h100x8, hf_model, prod  # noqa: F401  (fixtures)


@pytest.mark.parametrize("mode,kind", [("segv", "crashed"), ("hang", "timeout"), ("oom", "memory"),
                                       ("incomplete", "incomplete"), ("exit1", "exit")])
def test_build_faults_publish_nothing(mode, kind, fake_tools, hf_model, prod, tmp_path, monkeypatch, record_fault):  # noqa: F811
    monkeypatch.setenv("FAKE_TRTLLM_MODE", mode)
    data = json.loads(json.dumps(load_profile(prod).model_dump(mode="json")))
    # Only the hang needs the timeout to be short; the others must fail by their own cause first,
    # on a busy machine too (with 3 s for all, the memory case lost the race to the timeout there).
    data["engine"]["build_timeout_s"] = 3 if mode == "hang" else 120
    data["engine"]["build_memory_limit_mb"] = 1024
    profile = parse_profile(data)
    store = open_store(f"file://{tmp_path}/store")
    with pytest.raises(BuildFailedError) as exc:
        build.build(Context.from_settings(settings(), store=store), profile, model=str(hf_model), fingerprint=h100x8(), workdir=tmp_path / "work")
    assert exc.value.kind == kind
    if mode == "oom":
        assert "passed the 1024 MiB limit" in exc.value.log_tail
    assert list_artifacts(store) == [] and list(store.root.glob("blobs/*/*")) == []
    assert [p.name for p in (tmp_path / "work").iterdir() if not p.name.startswith("buildctl-failed-")] == []
    # the orchestrator (this process) carries on: the next build works
    monkeypatch.setenv("FAKE_TRTLLM_MODE", "ok")
    ok = build.build(Context.from_settings(settings(), store=store), profile, model=str(hf_model), fingerprint=h100x8(), workdir=tmp_path / "work")
    assert not ok.cache_hit and len(list_artifacts(store)) == 1
    record_fault(f"builder {mode}", f"fake trtllm-build: {mode}" + (" past a 1 GiB resident-memory limit" if mode == "oom" else ""), 1,
                 outcome=f"ok (BuildFailedError {kind}, nothing published, next build fine)")
