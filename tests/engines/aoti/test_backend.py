"""The aoti backend end to end on the tiny Llama: a real AOTInductor build, cache, pull, load, generate."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from buildctl.artifact_store.read import get_manifest, verify
from buildctl.core.times import utc_now
from buildctl.artifact_store.errors import PreflightError
from buildctl.artifact_store.node.install_dir import current_artifact, install_artifact
from buildctl.steps import build, host
from buildctl.engines.aoti.backend import AotiBackend
from buildctl.engines.errors import EngineLoadError, IncompatibleTargetError
from buildctl.engines.fingerprint import detect
from buildctl.steps.context import Context

from ...support.helpers import PROFILES, settings, write_attestation

pytestmark = pytest.mark.slow
TINY = PROFILES / "tiny-llama-cpu.yaml"
FIXTURES = Path(__file__).resolve().parents[2] / "support" / "fixtures"


def test_build_published_with_log_and_record(tiny_build):
    o = tiny_build["outcome"]
    assert not o.cache_hit and o.build_s > 1
    m = verify(tiny_build["store"], o.artifact_id, deep=True)
    assert [f.path for f in m.files] == ["decode.pt2", "engine.json", "prefill.pt2"]
    assert m.build_key == o.build_key and m.model_digest == o.model_digest and m.build_log
    log = tiny_build["store"].get_bytes(f"blobs/{m.build_log[9:11]}/{m.build_log[9:]}").decode()
    assert "[aoti] wrote" in log
    # the two graphs compile at once, decode in a child process of the compile step
    assert "prefill here, decode in process" in log
    assert "compiled prefill.pt2" in log and "compiled decode.pt2" in log
    record = json.loads((tiny_build["engine"] / "engine.json").read_text())
    assert record["compat_key"] == detect().compat_key("aoti") and record["cpu_isa"] == "avx2"
    assert record["torch"] == detect().torch_version and record["model_digest"] == o.model_digest
    # the KV cache, sized from the profile and reported at build: [layers, 2, batch, kv heads, length, head dim]
    profile = tiny_build["profile"].engine
    assert record["format"] == 2 and record["cache_shape"] == [2, 2, profile.max_batch_size, 2, profile.max_seq_len, 32]
    assert record["cache_bytes"] == 2 * 2 * profile.max_batch_size * 2 * profile.max_seq_len * 32 * 4
    assert f"KV cache {record['cache_shape']}: {record['cache_bytes'] / 2**20:.1f} MiB" in log


def test_second_build_is_a_cache_hit_without_builder(tiny_build, monkeypatch):
    def no_builder(*a, **k):
        raise AssertionError("a builder was started on a cache hit")

    from buildctl.engines.aoti.backend import AotiBackend

    monkeypatch.setattr(AotiBackend, "build", no_builder)  # the host check may construct the backend
    monkeypatch.setattr(build, "run_build", no_builder)
    monkeypatch.setattr("buildctl.engines.isolate.run_step", no_builder)
    t0 = time.monotonic()
    again = build.build(Context.from_settings(settings(), store=tiny_build["store"]), tiny_build["profile"])
    hit_s = time.monotonic() - t0
    assert again.cache_hit and again.artifact_id == tiny_build["outcome"].artifact_id
    assert hit_s < 0.2 * tiny_build["first_s"], (hit_s, tiny_build["first_s"])


def test_greedy_tokens_equal_hf_transformers(tiny_build):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_build["model"])
    hf = AutoModelForCausalLM.from_pretrained(tiny_build["model"], dtype=torch.float32).eval()
    texts = ["A build pipeline turns", "Channels point at", "The quick brown fox", "When a driver is upgraded",
             "Speed is judged", "An artifact is", "Every node in the fleet", "Monday, Tuesday"]
    prompts = [tok(t)["input_ids"] for t in texts] + [[1, 17, 250, 999, 3, 42]]
    runner = AotiBackend(settings()).load(tiny_build["engine"])
    try:
        gens = runner.generate(prompts, max_tokens=24, top_logprobs=5)
    finally:
        runner.close()
    for p, g in zip(prompts, gens):
        with torch.no_grad():
            ids = torch.tensor([p])
            ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, min_new_tokens=24,
                              do_sample=False)[0, len(p):].tolist()
        assert g.token_ids == ref
        assert len(g.top_logprobs) == 24 and all(len(t) == 5 and g.token_ids[i] in t for i, t in enumerate(g.top_logprobs))
        with torch.no_grad():
            logits = hf(torch.tensor([p + g.token_ids[:-1]])).logits[0, len(p) - 1:].float()
        ref_lp = torch.log_softmax(logits, -1)
        for i, tops in enumerate(g.top_logprobs):
            for t, v in tops.items():
                assert abs(v - float(ref_lp[i, t])) < 1e-3


def test_batched_and_streamed_generation_agree(tiny_build):
    runner = AotiBackend(settings()).load(tiny_build["engine"])
    try:
        prompts = [[1, 5, 9, 13], [1, 6, 10, 14], [1, 2], [7, 8, 9, 10]]
        batched = runner.generate(prompts, 10, 0)
        single = [runner.generate([p], 10, 0)[0] for p in prompts]
        assert [g.token_ids for g in batched] == [g.token_ids for g in single]
        for concurrency in (1, 3, 4):
            events = list(runner.stream(prompts, 10, concurrency))
            assert [[e.token_id for e in events if e.index == i and e.token_id is not None] for i in range(4)] == \
                [g.token_ids for g in batched]
            starts = {e.index: e.time for e in events if e.token_id is None}
            assert sorted(starts) == [0, 1, 2, 3]
            assert all(e.time >= starts[e.index] for e in events)
            waves = len({t for t in starts.values()})
            assert waves == -(-4 // concurrency)
    finally:
        runner.close()


def test_staggered_requests_on_the_compiled_graphs_equal_the_eager_graphs(tiny_build):
    """Requests of different lengths join and leave mid-run (some done right after prefill), at
    two concurrencies: every output equals the eager graphs', token for token."""
    import random

    from buildctl.engines.batching import ContinuousBatcher, Request
    from buildctl.engines.aoti.kv_llama import EagerKVModel

    rng = random.Random(7)
    reqs = [Request([rng.randrange(4, 1024) for _ in range(rng.randint(1, 48))], rng.choice([1, 2, 5, 16, 24]),
                    arrival=rng.randint(0, 20)) for _ in range(48)]
    eager = ContinuousBatcher(EagerKVModel(str(tiny_build["model"])), max_batch=1, max_seq=128).run(reqs, 5)
    runner = AotiBackend(settings()).load(tiny_build["engine"])
    try:
        for concurrency in (5, 17):
            got = runner.generate_requests(reqs, 5, concurrency=concurrency)
            assert [g.token_ids for g in got] == [g.token_ids for g in eager]
            assert max(abs(v - e.top_logprobs[i][t]) for g, e in zip(got, eager)
                       for i, tops in enumerate(g.top_logprobs) for t, v in tops.items()) <= 1e-4
    finally:
        runner.close()


def test_an_engine_of_record_format_1_still_loads_and_generates(tiny_build, tmp_path):
    """Stores written before format 2 keep serving: a format-1 engine (one logits graph, no KV
    cache, compiled here as the old build step did) loads and generates what the new one does."""
    import subprocess
    import sys

    record = json.loads((tiny_build["engine"] / "engine.json").read_text())
    old = {k: v for k, v in record.items() if k not in ("architecture", "cache_shape", "cache_bytes", "prefill_tokens")}
    old["format"] = 1
    (tmp_path / "record.json").write_text(json.dumps(old))
    env = {**os.environ, "TMPDIR": str(tmp_path), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
           "ATEN_CPU_CAPABILITY": "avx2", "TORCHINDUCTOR_CPP_MARCH": "x86-64-v3"}
    r = subprocess.run([sys.executable, str(FIXTURES / "make_aoti_format1.py"), "--model", str(tiny_build["model"]),
                        "--out", str(tmp_path / "v1"), "--record", str(tmp_path / "record.json")],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    v1 = AotiBackend(settings()).load(tmp_path / "v1")
    v2 = AotiBackend(settings()).load(tiny_build["engine"])
    try:
        prompts = [[1, 5, 9, 13], [7, 8], [42]]
        assert [g.token_ids for g in v1.generate(prompts, 8, 0)] == [g.token_ids for g in v2.generate(prompts, 8, 0)]
    finally:
        v1.close()
        v2.close()


def edited_copy(src: Path, dest: Path, **changes) -> Path:
    shutil.copytree(src, dest)
    for f in dest.iterdir():
        f.chmod(0o644)
    rec = json.loads((dest / "engine.json").read_text())
    for k, v in changes.items():
        if k.startswith("compat_fields."):
            rec["compat_fields"][k.split(".", 1)[1]] = v
            rec["compat_key"] = "aoti-" + "0" * 32
        else:
            rec[k] = v
    (dest / "engine.json").write_text(json.dumps(rec))
    return dest


def test_load_refuses_an_engine_for_another_host(tiny_build, tmp_path):
    d = edited_copy(tiny_build["engine"], tmp_path / "e", **{"compat_fields.torch_version": "2.0.0"})
    with pytest.raises(IncompatibleTargetError) as exc:
        AotiBackend(settings()).load(d)
    assert exc.value.differences == {"torch_version": ("2.0.0", detect().torch_version)}


def test_load_refuses_a_tampered_record(tiny_build, tmp_path):
    d = edited_copy(tiny_build["engine"], tmp_path / "e", max_batch_size=64)
    with pytest.raises(EngineLoadError) as exc:
        AotiBackend(settings()).load(d)
    assert "does not match the record embedded" in str(exc.value)


def test_pull_installs_an_engine_that_loads_and_generates(tiny_build, cli, tmp_path):
    store, aid = tiny_build["store"], tiny_build["outcome"].artifact_id
    write_attestation(store, aid, tiny_build["outcome"].compat_key, "pass", utc_now())
    code, _, err = cli("--store", tiny_build["uri"], "promote", aid, "--channel", "staging")
    assert code == 0, err
    dest = tmp_path / "node"
    code, out, err = cli("--store", tiny_build["uri"], "--json", "pull", "--profile", "tiny-llama-cpu",
                         "--channel", "staging", "--dest", dest)
    assert code == 0 and json.loads(out)["installed"], err
    code, out, err = cli("--json", "generate", dest / "current", "--prompt-ids", "1,5,9,13", "--max-tokens", "6")
    assert code == 0, err
    runner = AotiBackend(settings()).load(tiny_build["engine"])
    try:
        assert json.loads(out)["token_ids"] == runner.generate([[1, 5, 9, 13]], 6, 0)[0].token_ids
    finally:
        runner.close()


def test_preflight_keeps_a_foreign_engine_from_becoming_current(tiny_build, tmp_path, monkeypatch):
    store, aid = tiny_build["store"], tiny_build["outcome"].artifact_id
    dest = tmp_path / "node"
    install_artifact(store, aid, dest, preflight=host.preflight_for(settings()))
    assert current_artifact(dest) == aid
    other = detect().model_copy(update={"torch_version": "2.99.0"})
    fp = tmp_path / "other-host.json"
    fp.write_text(json.dumps(other.model_dump(mode="json")))
    monkeypatch.setenv("BUILDCTL_FINGERPRINT_FILE", str(fp))  # the preflight subprocess sees "another host"
    dest2 = tmp_path / "node2"
    with pytest.raises(PreflightError) as exc:
        install_artifact(store, aid, dest2, preflight=host.preflight_for(settings()))
    assert "torch" in str(exc.value) and "2.99.0" in str(exc.value)
    assert current_artifact(dest2) is None and not list(dest2.glob(".staging-*"))


def test_a_build_that_waited_for_its_slot_takes_the_artifact_a_concurrent_run_published(tiny_build, tmp_path,
                                                                                        monkeypatch):
    """Two runs of one build key: both planned before either built. The second gets the slot after
    the first published: it checks the cache again inside the slot and builds nothing (#29)."""
    from contextlib import nullcontext

    from buildctl.artifact_store.backends.store import open_store

    store = open_store(f"file://{tmp_path / 'store'}")
    ctx = Context.from_settings(settings(), store=store)
    plan = build.plan_build(ctx, tiny_build["profile"])
    assert plan.cached is None  # nothing built yet when it planned
    winner = build.import_engine(ctx, tiny_build["engine"], tiny_build["profile"], plan.fingerprint,
                                    model_digest=plan.model_digest)  # the other run, meanwhile
    assert get_manifest(store, winner.artifact_id).build_key == plan.build_key

    def no_builder(*a, **k):
        raise AssertionError("a second build of one build key")

    monkeypatch.setattr(build, "run_build", no_builder)
    got = build.build_in_slot(ctx, plan, nullcontext())
    assert got == winner.artifact_id
