"""The trtllm backend held to TensorRT-LLM's contract, as read from its sources.

``tests/support/fixtures/trtllm/<version>/`` records, per release, each tool's flags (type, choices,
default), the engine directory's layout, the C++ runner's API and when each output is present,
and the software stack the release ships with; every fixture names its source file and commit.
The fakes in ``tests/support/fakes/`` enforce those facts: the tools parse argv with an equivalent
argparse parser (exit 2 on an unknown flag or value), and the fake runtime returns
``sequence_lengths`` and ``generation_logits`` only when asked, ``[]`` on non-leader ranks, and
loads a TP engine only under a matching MPI world or in orchestrator mode.

Each ``test_item_N_*`` test is one finding of the audit (issue 16); each fails on the code before
its fix. Nothing here has run against real TensorRT-LLM: ``scripts/gpu-acceptance.sh`` is the
runbook for a GPU node.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from buildctl.engines.errors import EngineBuildError, EngineLoadError, HostRequirementsError, ProfileError
from buildctl.engines.profile import QUANTIZATION_VALUES, load_profile, parse_profile
from buildctl.engines.trtllm.backend import (RELEASES, TrtllmBackend, TrtllmRunner, TrtllmTools, build_command, convert_command,
                                     release_for)

from ...support.helpers import PROFILES, REPO, settings
from ...support.fakes.contract import FIXTURES, VERSIONS, fixture, parse
from ...support.trtllm_kit import FAKES, calib, fake_tools, h100x8, hf_model, prod, stack, use_release  # noqa: F401

TOOLS = ("trtllm-build", "convert_checkpoint", "quantize", "engine", "stack")


# -- the fixtures themselves ----------------------------------------------------------------------

@pytest.mark.parametrize("version", VERSIONS)
def test_every_fixture_loads_and_names_its_sources(version):
    names = {p.stem for p in (FIXTURES / version).glob("*.json")}
    assert set(TOOLS) <= names
    for name in names:
        data = fixture(version, name)
        assert data["sources"], f"{version}/{name} names no source"
        for src in data["sources"]:
            has_commit = isinstance(src.get("commit"), str) and len(src["commit"]) == 40
            assert has_commit or src.get("ref") or src.get("note"), f"{version}/{name}: a source without a commit must say why"
    for tool in ("trtllm-build", "convert_checkpoint", "quantize"):
        parser_flags = fixture(version, tool)["flags"]
        assert len({f["name"] for f in parser_flags}) == len(parser_flags), "each flag once"


def test_runtime_fixture_loads():
    rt = fixture("1.2.1", "runtime")
    assert {"output_generation_logits", "output_sequence_lengths", "streaming"} <= set(rt["generate"]["keywords"])
    assert {"is_orchestrator_mode", "device_ids", "gather_generation_logits"} <= set(rt["from_dir"]["keywords"])
    assert rt["outputs"]["sequence_lengths"]["when"] == "output_sequence_lengths=True"


@pytest.mark.parametrize("version", VERSIONS)
def test_release_table_matches_the_fixtures(version):
    """buildctl/engines/trtllm/backend.py's per-release facts agree with what the sources say."""
    release = release_for(stack(version)["tensorrt_llm"])
    assert release is not None
    conv = fixture(version, "convert_checkpoint")
    assert "examples/" + release.convert_script == conv["path"]
    conv_flags = {f["name"] for f in conv["flags"]}
    assert set(release.converter_kv_flags.values()) <= conv_flags
    assert {"--int8_kv_cache", "--fp8_kv_cache"} & conv_flags == set(release.converter_kv_flags.values())
    assert release.converter_calib_size == ("--calib_size" in conv_flags)
    assert release.quantize_script == "quantization/quantize.py"


# -- strict fakes: what the real argparse rejects, they reject -------------------------------------

def run_tool(path: Path, args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


def test_fakes_exit_2_with_argparse_message_on_unknown_flag_or_value(tmp_path):
    build = run_tool(FAKES / "trtllm-build", ["--checkpoint_dir", str(tmp_path), "--gemm_plugin", "fp16"])
    assert build.returncode == 2 and "argument --gemm_plugin: invalid choice: 'fp16'" in build.stderr
    build = run_tool(FAKES / "trtllm-build", ["--checkpoint_dir", str(tmp_path), "--use_fp8_context_fmha", "true"])
    assert build.returncode == 2 and "invalid choice: 'true' (choose from 'enable', 'disable')" in build.stderr
    conv = run_tool(FAKES / "trtllm/1.2.1/examples/models/core/llama/convert_checkpoint.py",
                    ["--model_dir", str(tmp_path), "--int8_kvcache"])
    assert conv.returncode == 2 and "unrecognized arguments: --int8_kvcache" in conv.stderr
    quant = run_tool(FAKES / "trtllm/1.2.1/examples/quantization/quantize.py",
                     ["--model_dir", str(tmp_path), "--qformat", "fp8", "--kv_cache_dtype", "fp16"])
    assert quant.returncode == 2 and "argument --kv_cache_dtype: invalid choice: 'fp16'" in quant.stderr
    old = run_tool(FAKES / "trtllm-build", ["--checkpoint_dir", str(tmp_path), "--auto_parallel", "2"],
                   env={"FAKE_TRTLLM_VERSION": "1.2.1"})
    assert old.returncode == 2 and "unrecognized arguments: --auto_parallel" in old.stderr, "1.x removed auto-parallel"


def schema_engines() -> list[dict]:
    """Every quantization x KV dtype the profile schema accepts for trtllm, at TP2."""
    out = []
    for q in QUANTIZATION_VALUES:
        for kv in ("auto", "fp8", "int8", "fp16", "bf16"):
            engine = {"backend": "trtllm", "quantization": q, "kv_cache_dtype": kv, "tp_size": 2, "min_sm": 90,
                      "calibration": {"dataset": "/data/calib"}}
            try:
                parse_profile({"name": "x", "model": {"path": "/m", "dtype": "bfloat16"}, "engine": engine})
            except ProfileError:
                continue
            out.append(engine)
    return out


@pytest.mark.parametrize("version", VERSIONS)
def test_every_argv_buildctl_can_emit_parses_under_the_release(version, monkeypatch):
    """For every accepted profile, the converter/quantizer and trtllm-build argv parse under that
    release's flags, or the host check refuses the combination before any tool runs."""
    use_release(monkeypatch, version)
    engines = schema_engines()
    assert len(engines) >= 14 and not [e for e in engines if e["kv_cache_dtype"] in ("fp16", "bf16")]
    backend = TrtllmBackend(settings())
    tools = backend.tools(h100x8(version=version))
    refused = 0
    for engine in engines:
        p = parse_profile({"name": "x", "model": {"path": "/m", "dtype": "bfloat16"}, "engine": engine})
        unmet = [u for u in backend.unmet_requirements(p, h100x8(version=version)) if "calibration dataset" not in u]
        if unmet:
            assert version == "0.16" and engine["quantization"] == "none" and engine["kv_cache_dtype"] == "fp8", unmet
            assert "engine.kv_cache_dtype fp8 with engine.quantization none" in unmet[0]
            refused += 1
            continue
        conv = convert_command(p, Path("/m"), Path("/c"), tools)
        tool = "quantize" if conv[1].endswith("quantize.py") else "convert_checkpoint"
        args = parse(version, tool, conv[2:])
        kv = args.kv_cache_dtype if tool == "quantize" else ("fp8" if getattr(args, "fp8_kv_cache", False)
                                                             else "int8" if args.int8_kv_cache else None)
        assert kv == (None if engine["kv_cache_dtype"] == "auto" else engine["kv_cache_dtype"]), (engine, conv)
        parse(version, "trtllm-build", build_command(p, Path("/c"), Path("/o"), tools)[1:])
    assert refused == (1 if version == "0.16" else 0)


def test_engine_directory_matches_the_fixture(hf_model, fake_tools, prod, tmp_path):
    spec = fixture("1.2.1", "engine")["config_json"]
    out = tmp_path / "engine"
    TrtllmBackend(settings()).build(load_profile(prod), hf_model, out, h100x8(), tmp_path / "log")
    config = json.loads((out / "config.json").read_text())
    assert set(spec["required"]) <= set(config)
    assert set(spec["pretrained_config"]["required"]) <= set(config["pretrained_config"])
    assert set(spec["pretrained_config"]["mapping"]["required"]) <= set(config["pretrained_config"]["mapping"])
    assert not set(spec["build_config"]["absent"]) & set(config["build_config"])
    assert sorted(p.name for p in out.iterdir()) == ["config.json"] + [f"rank{r}.engine" for r in range(8)]


# -- item 1, 2, 3, 4: the runner -------------------------------------------------------------------

@pytest.fixture
def fake_runtime(monkeypatch):
    """The strict fake ``tensorrt_llm`` importable in this process, removed afterwards."""
    monkeypatch.syspath_prepend(str(FAKES / "pymods"))
    for name in [m for m in sys.modules if m.split(".")[0] in ("tensorrt_llm", "tensorrt")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delenv("OMPI_COMM_WORLD_SIZE", raising=False)
    monkeypatch.delenv("OMPI_COMM_WORLD_RANK", raising=False)
    yield
    for name in [m for m in sys.modules if m.split(".")[0] in ("tensorrt_llm", "tensorrt")]:
        sys.modules.pop(name, None)


def small_engine(tmp_path: Path, hf_model: Path, tp: int = 1, max_batch_size: int = 4) -> Path:
    p = parse_profile({"name": "small", "model": {"path": str(hf_model), "dtype": "float16"},
                       "engine": {"backend": "trtllm", "tp_size": tp, "max_batch_size": max_batch_size,
                                  "max_input_len": 1024, "max_seq_len": 2048}})
    out = tmp_path / f"engine-tp{tp}-b{max_batch_size}"
    TrtllmBackend(settings()).build(p, hf_model, out, h100x8(), tmp_path / f"log{tp}")
    return out


PROMPTS = [[5, 6, 7], [9, 10], [100, 200, 300, 400], [42], [7, 7, 7, 7, 7]]


def toy_greedy(prompt: list[int], n: int) -> list[int]:
    from tensorrt_llm.runtime import toy_model  # the fake's model

    step, seq = toy_model(1024), list(prompt)
    for _ in range(n):
        seq.append(step(seq)[0])
    return seq[len(prompt):]


def test_item_1_top_k_logprobs_are_produced(hf_model, fake_tools, fake_runtime, tmp_path):
    runner = TrtllmRunner(small_engine(tmp_path, hf_model))
    gens = runner.generate(PROMPTS, max_tokens=6, top_logprobs=5)
    assert [g.token_ids for g in gens] == [toy_greedy(p, 6) for p in PROMPTS]
    for g in gens:
        assert len(g.top_logprobs) == 6
        for tok, top in zip(g.token_ids, g.top_logprobs):
            assert len(top) == 5 and max(top, key=top.get) == tok and top[tok] > -0.1
    from tensorrt_llm.runtime import LOADED

    assert LOADED[-1]["gather_generation_logits"] is True
    assert runner.generate(PROMPTS[:1], max_tokens=3, top_logprobs=0)[0].top_logprobs == []


def test_item_2_streaming_uses_sequence_lengths_and_deltas(hf_model, fake_tools, fake_runtime, tmp_path):
    runner = TrtllmRunner(small_engine(tmp_path, hf_model))
    events = list(runner.stream(PROMPTS, max_tokens=5, concurrency=2))
    per = {i: [e.token_id for e in events if e.index == i and e.token_id is not None] for i in range(len(PROMPTS))}
    assert per == {i: toy_greedy(p, 5) for i, p in enumerate(PROMPTS)}, "no end_id padding streamed as tokens"
    times = [e.time for e in events]
    assert times == sorted(times)
    # one token per step, not the whole buffer at the first step
    first = {i: min(e.time for e in events if e.index == i and e.token_id is not None) for i in per}
    last = {i: max(e.time for e in events if e.index == i and e.token_id is not None) for i in per}
    assert all(last[i] > first[i] for i in per)


def test_top_logprobs_are_the_log_softmax_over_the_vocabulary_of_each_step(hf_model, fake_tools, fake_runtime, tmp_path):
    """The values, not only the ranking: each step's top-k logprobs equal log_softmax over the
    vocabulary of that step's generation logits, computed here from the fake's toy model."""
    import torch
    from tensorrt_llm.runtime import toy_model

    runner = TrtllmRunner(small_engine(tmp_path, hf_model))
    (gen,) = runner.generate([[5, 6, 7]], max_tokens=4, top_logprobs=3)
    step, seq = toy_model(1024), [5, 6, 7]
    for tok, top in zip(gen.token_ids, gen.top_logprobs):
        nxt, row = step(seq)
        lp = torch.log_softmax(row.float(), dim=-1)
        vals, idx = torch.topk(lp, 3)
        assert nxt == tok and top == pytest.approx({int(i): float(v) for i, v in zip(idx, vals)})
        seq.append(nxt)


def test_streaming_at_concurrency_one_keeps_one_request_in_flight(hf_model, fake_tools, fake_runtime, tmp_path):
    runner = TrtllmRunner(small_engine(tmp_path, hf_model))
    order = [(e.index, e.token_id) for e in runner.stream(PROMPTS[:3], max_tokens=3, concurrency=1)]
    # request k is submitted only after request k-1's last token
    assert order == [(i, t) for i, p in enumerate(PROMPTS[:3]) for t in [None, *toy_greedy(p, 3)]]


def test_requests_never_end_early_at_a_token_id(hf_model, fake_tools, fake_runtime, tmp_path):
    """buildctl asks for exactly max_tokens (end_id -1, which no token equals): greedy outputs that
    contain token 0 or 1 (prompts 92 and 140 of the toy model) are not cut there, in generate or
    stream. Parity and speed compare equal-length outputs."""
    runner = TrtllmRunner(small_engine(tmp_path, hf_model))
    prompts = [[92], [140]]
    assert 0 in toy_greedy([92], 12)[:-1] and 1 in toy_greedy([140], 12)[:-1]
    assert [g.token_ids for g in runner.generate(prompts, max_tokens=12, top_logprobs=0)] == [
        toy_greedy(p, 12) for p in prompts]
    events = list(runner.stream(prompts, max_tokens=12, concurrency=2))
    assert [[e.token_id for e in events if e.index == i and e.token_id is not None] for i in (0, 1)] == [
        toy_greedy(p, 12) for p in prompts]


def test_item_3_tp_engine_runs_in_orchestrator_mode_and_results_come_from_the_leader(
        hf_model, fake_tools, fake_runtime, tmp_path, monkeypatch):
    engine = small_engine(tmp_path, hf_model, tp=2)
    runner = TrtllmRunner(engine)
    from tensorrt_llm.runtime import LOADED

    assert LOADED[-1]["is_orchestrator_mode"] is True and LOADED[-1]["device_ids"] == [0, 1]
    assert [g.token_ids for g in runner.generate(PROMPTS, 4, 0)] == [toy_greedy(p, 4) for p in PROMPTS]
    # Under mpirun, a non-leader rank gets [] from the real runner: refuse, never report no tokens.
    from tensorrt_llm.runtime import ModelRunnerCpp

    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    follower = ModelRunnerCpp.from_dir(str(engine), rank=1)
    assert follower.generate([__import__("torch").tensor([1, 2])], max_new_tokens=2) == []
    with pytest.raises(EngineLoadError, match="orchestrator mode needs an MPI world size of 1"):
        TrtllmRunner(engine)
    runner.runner = follower
    with pytest.raises(EngineLoadError, match="not the leader rank"):
        runner.generate(PROMPTS, 2, 0)


def test_item_4_speed_runs_batch_in_flight(hf_model, fake_tools, fake_runtime, tmp_path):
    """With two slots, the third request starts when the first finishes, while the second is still
    running; static waves would wait for the whole wave."""
    runner = TrtllmRunner(small_engine(tmp_path, hf_model))
    events = list(runner.stream(PROMPTS, max_tokens=4, concurrency=2))
    order = [(e.index, e.token_id) for e in events]
    submitted_2 = order.index((2, None))
    last_of_1 = max(k for k, (i, t) in enumerate(order) if i == 1 and t is not None)
    assert submitted_2 < last_of_1
    in_flight = peak = 0
    for i, t in order:
        in_flight += 1 if t is None else 0
        peak = max(peak, in_flight)
        if t is not None and sum(1 for j, u in order[:order.index((i, t)) + 1] if j == i and u is not None) == 4:
            in_flight -= 1
    assert peak == 2


def test_the_staggered_parity_set_runs_through_the_executor_in_flight(hf_model, fake_tools, fake_runtime, tmp_path):
    """Validation's staggered set on the trtllm runner (issue 31): each request with its own
    max_tokens and arrival through the executor's streamed path equals the same prompt's solo
    output, tokens and top-k logprobs (from the streamed logits layout, [tokens, num_sequences,
    vocab]), at both of validation's concurrencies; requests join a running batch and leave it."""
    from buildctl.validators.parity import STAGGERED_CONCURRENCY, check_staggered, staggered_requests

    runner = TrtllmRunner(small_engine(tmp_path, hf_model, max_batch_size=32))
    prompts = [[(7 * i + j) % 1000 + 3 for j in range(1 + i % 6)] for i in range(24)]
    solo = [runner.generate([p], max_tokens=12, top_logprobs=5)[0] for p in prompts]
    requests = staggered_requests(prompts, 12)
    executor = runner.runner.executor
    for c in STAGGERED_CONCURRENCY:
        seen: list[int] = []  # requests in flight at each enqueue
        enqueue = executor.enqueue_requests

        def watched(reqs, enqueue=enqueue, seen=seen):
            seen.append(len(executor.live))
            return enqueue(reqs)

        executor.enqueue_requests = watched
        out = runner.generate_requests(requests, top_logprobs=5, concurrency=c)
        executor.enqueue_requests = enqueue
        report = check_staggered(solo, out, requests)
        assert report.passed and report.identical_fraction == 1.0, report.reasons()
        assert [len(g.token_ids) for g in out] == [q.max_tokens for q in requests]
        assert max(seen) == c - 1, "the in-flight limit is the concurrency"
        late = seen[c:]  # enqueued after the first c: each one took the place of one that left
        assert len(late) == len(requests) - c and all(n > 0 for n in late), "requests join a running batch"


def test_staggered_arrivals_hold_a_request_back_and_idle_gaps_are_skipped(hf_model, fake_tools, fake_runtime, tmp_path):
    from buildctl.engines.batching import Request

    runner = TrtllmRunner(small_engine(tmp_path, hf_model))
    executor = runner.runner.executor
    order: list[tuple[int, int]] = []  # (responses seen so far, request's prompt head) at each enqueue
    enqueue, responses = executor.enqueue_requests, executor.await_responses
    count = [0]

    def counted():
        count[0] += 1
        return responses()

    executor.await_responses = counted
    executor.enqueue_requests = lambda reqs: (order.append((count[0], reqs[0].input_token_ids[0])), enqueue(reqs))[1]
    out = runner.generate_requests([Request([50], 8, arrival=0), Request([60], 3, arrival=3),
                                    Request([70], 1, arrival=40)], top_logprobs=0, concurrency=4)
    assert [g.token_ids for g in out] == [toy_greedy([50], 8), toy_greedy([60], 3), toy_greedy([70], 1)]
    # the fake answers one token of one request per await_responses()
    assert order == [(0, 50), (3, 60), (8 + 3, 70)], "each waits for its step; an idle gap is skipped, not waited"


def test_staggered_requests_at_concurrency_one_run_one_at_a_time(hf_model, fake_tools, fake_runtime, tmp_path):
    from buildctl.engines.batching import Request

    runner = TrtllmRunner(small_engine(tmp_path, hf_model))
    executor = runner.runner.executor
    seen: list[int] = []  # requests in flight at each enqueue
    enqueue = executor.enqueue_requests
    executor.enqueue_requests = lambda reqs: (seen.append(len(executor.live)), enqueue(reqs))[1]
    out = runner.generate_requests([Request([50], 4), Request([60], 3), Request([70], 2)], top_logprobs=0,
                                   concurrency=1)
    assert [g.token_ids for g in out] == [toy_greedy([50], 4), toy_greedy([60], 3), toy_greedy([70], 2)]
    assert seen == [0, 0, 0], "concurrency 1: each request waits for the one before it to finish"


def test_the_timed_stream_asks_for_no_logits(hf_model, fake_tools, fake_runtime, tmp_path):
    """The speed run measures tokens only: asking the executor for generation logits would time
    their device-to-host copies too (OutputConfig.return_generation_logits stays off)."""
    runner = TrtllmRunner(small_engine(tmp_path, hf_model))
    executor = runner.runner.executor
    asked: list[bool] = []
    enqueue = executor.enqueue_requests
    executor.enqueue_requests = lambda reqs: (
        asked.extend(r.output_config.return_generation_logits for r in reqs), enqueue(reqs))[1]
    list(runner.stream(PROMPTS[:3], max_tokens=2, concurrency=2))
    assert asked == [False, False, False]


def test_logits_asked_of_an_executor_without_gather_fail_as_upstream_does(hf_model, fake_tools, fake_runtime, tmp_path):
    from buildctl.engines.batching import Request
    from tensorrt_llm.runtime import ModelRunnerCpp

    engine = small_engine(tmp_path, hf_model)
    runner = TrtllmRunner(engine)
    runner.runner = ModelRunnerCpp.from_dir(str(engine), rank=0)  # no gather_generation_logits
    with pytest.raises(EngineLoadError, match="gather_generation_logits must be enabled in ExecutorConfig"):
        runner.generate_requests([Request([5, 6], 3)], top_logprobs=2)
    with pytest.raises(RuntimeError, match="gather_generation_logits must be enabled"):
        runner.generate(PROMPTS[:1], max_tokens=2, top_logprobs=2)
    assert [g.token_ids for g in runner.generate_requests([Request([5, 6], 3)], top_logprobs=0)] == [toy_greedy([5, 6], 3)]


# -- items 5 to 11: the build --------------------------------------------------------------------

def test_item_5_fp8_kv_cache_on_the_converter_path(hf_model, fake_tools, calib, tmp_path, monkeypatch):
    p = parse_profile({"name": "kv", "model": {"path": str(hf_model), "dtype": "bfloat16"},
                       "engine": {"backend": "trtllm", "kv_cache_dtype": "fp8", "max_batch_size": 4}})
    out = tmp_path / "e"
    TrtllmBackend(settings()).build(p, hf_model, out, h100x8(), tmp_path / "log")
    calls = json.loads((fake_tools / "convert.jsonl").read_text().splitlines()[0])
    assert "--fp8_kv_cache" in calls
    assert json.loads((out / "config.json").read_text())["pretrained_config"]["quantization"]["kv_cache_quant_algo"] == "FP8"
    # 0.16's converter has no such flag: refused before anything runs, naming both fields
    use_release(monkeypatch, "0.16")
    with pytest.raises(HostRequirementsError) as exc:
        TrtllmBackend(settings()).build(p, hf_model, tmp_path / "e2", h100x8(version="0.16"), tmp_path / "log2")
    assert "engine.kv_cache_dtype fp8 with engine.quantization none" in str(exc.value)
    # and the engine's recorded quantization is checked: a tool that drops the KV dtype is refused
    from buildctl.engines.trtllm.backend import check_quantization

    plain = parse_profile({"name": "kv", "model": {"path": "/m"}, "engine": {"backend": "trtllm"}})
    assert check_quantization(out, plain.engine) == [
        "config.json records kv_cache_quant_algo FP8, the profile's kv_cache_dtype auto needs None"]


def test_a_built_engine_whose_recorded_quantization_differs_is_refused(hf_model, fake_tools, tmp_path, monkeypatch):
    """A complete engine directory is still refused when its config.json records another KV dtype
    than the profile asks for (a converter flag dropped on the way); a good build reports its files,
    wall time and tool versions."""
    import buildctl.engines.trtllm.backend as trtllm_mod

    p = parse_profile({"name": "kv", "model": {"path": str(hf_model), "dtype": "bfloat16"},
                       "engine": {"backend": "trtllm", "kv_cache_dtype": "fp8", "max_batch_size": 4}})
    t0 = time.monotonic()
    res = TrtllmBackend(settings()).build(p, hf_model, tmp_path / "ok", h100x8(), tmp_path / "log")
    assert 0 < res.wall_s <= time.monotonic() - t0 and res.files == ["config.json", "rank0.engine"]
    assert res.tool_versions == {"tensorrt_llm": "1.2.1", "tensorrt": h100x8().tensorrt_version}
    real = trtllm_mod.convert_command
    monkeypatch.setattr(trtllm_mod, "convert_command",
                        lambda *a: [x for x in real(*a) if x != "--fp8_kv_cache"])
    with pytest.raises(EngineBuildError) as exc:
        TrtllmBackend(settings()).build(p, hf_model, tmp_path / "dropped", h100x8(), tmp_path / "log2")
    assert exc.value.kind == "incomplete" and "kv_cache_quant_algo None" in str(exc.value)
    assert not (tmp_path / "dropped").exists() and not list(tmp_path.glob(".build-*"))


def test_each_step_gets_what_is_left_of_the_build_timeout(hf_model, fake_tools, tmp_path, monkeypatch):
    """Steps that take 1.2 s each finish under a 60 s build timeout; a step that hangs is stopped
    once the build's 2 s are spent."""
    from buildctl.engines.errors import EngineBuildError

    def profile(timeout_s):
        return parse_profile({"name": "slow", "model": {"path": str(hf_model), "dtype": "bfloat16"},
                              "engine": {"backend": "trtllm", "max_batch_size": 4, "build_timeout_s": timeout_s}})

    monkeypatch.setenv("FAKE_TRTLLM_DELAY_S", "1.2")
    assert TrtllmBackend(settings()).build(profile(60), hf_model, tmp_path / "ok", h100x8(), tmp_path / "log").files
    monkeypatch.setenv("FAKE_TRTLLM_DELAY_S", "0")
    monkeypatch.setenv("FAKE_TRTLLM_MODE", "hang")
    t0 = time.monotonic()
    with pytest.raises(EngineBuildError) as exc:
        TrtllmBackend(settings()).build(profile(2), hf_model, tmp_path / "hung", h100x8(), tmp_path / "log2")
    assert exc.value.kind == "timeout" and "trtllm-build ran past" in exc.value.detail
    assert time.monotonic() - t0 < 30
    monkeypatch.setenv("FAKE_TRTLLM_FAIL_AT", "convert")  # the checkpoint conversion hangs instead
    with pytest.raises(EngineBuildError) as exc:
        TrtllmBackend(settings()).build(profile(2), hf_model, tmp_path / "hung2", h100x8(), tmp_path / "log3")
    assert exc.value.kind == "timeout" and "checkpoint conversion ran past" in exc.value.detail


def test_item_6_calibration_is_local_and_never_downloads(hf_model, fake_tools, prod, calib, tmp_path):
    data = yaml.safe_load(prod.read_text())
    del data["engine"]["calibration"]
    with pytest.raises(ProfileError) as exc:
        parse_profile(data)
    assert "calibration-required" in str(exc.value) and "cnn_dailymail" in str(exc.value)
    data["engine"]["calibration"] = {"dataset": "cnn_dailymail"}
    with pytest.raises(ProfileError, match="calibration-dataset-local"):
        parse_profile(data)
    out = tmp_path / "e"
    TrtllmBackend(settings()).build(load_profile(prod), hf_model, out, h100x8(), tmp_path / "log")
    argv = json.loads((fake_tools / "convert.jsonl").read_text().splitlines()[0])
    assert argv[argv.index("--calib_dataset") + 1] == str(calib) and argv[argv.index("--calib_size") + 1] == "512"
    # a dataset directory that is missing on this host is an unmet requirement, found before building
    data["engine"]["calibration"] = {"dataset": str(tmp_path / "absent")}
    unmet = TrtllmBackend(settings()).unmet_requirements(parse_profile(data), h100x8())
    assert unmet == [f"calibration dataset {tmp_path / 'absent'} is a local directory (builds never download)"]


def test_item_7_converter_path_follows_the_installed_release(hf_model, fake_tools, tmp_path, monkeypatch):
    use_release(monkeypatch, "0.16")
    p = parse_profile({"name": "plain", "model": {"path": str(hf_model), "dtype": "float16"},
                       "engine": {"backend": "trtllm", "max_batch_size": 4}})
    out = tmp_path / "e"
    TrtllmBackend(settings()).build(p, hf_model, out, h100x8(version="0.16"), tmp_path / "log")
    assert "[fake convert_checkpoint 0.16]" in (tmp_path / "log").read_text()
    assert TrtllmTools.from_settings(settings(), "0.16.0").convert.endswith("/examples/llama/convert_checkpoint.py")
    assert TrtllmTools.from_settings(settings(), "1.2.1").convert.endswith("/examples/models/core/llama/convert_checkpoint.py")
    assert [r.series for r in RELEASES] == ["1.2", "0.16"]


def test_item_8_shipped_fp8_profiles_disable_the_gemm_plugin():
    choices = next(f for f in fixture("1.2.1", "trtllm-build")["flags"] if f["name"] == "--gemm_plugin")["choices"]
    assert "disable" in choices
    fp8 = [load_profile(f) for f in sorted(PROFILES.glob("*.yaml"))]
    fp8 = [p for p in fp8 if p.engine.quantization == "fp8" and p.engine.backend == "trtllm"]  # plugins: trtllm only
    assert len(fp8) == 2
    for p in fp8:
        assert p.engine.resolved_plugins.gemm_plugin == "disable", p.name
        assert "NVIDIA's FP8 guidance" in (PROFILES / f"{p.name}.yaml").read_text()


def test_item_9_platform_is_in_the_trtllm_compat_key():
    x86, arm = h100x8(), h100x8().model_copy(update={"platform": "linux-aarch64"})
    assert x86.compat_key("trtllm") != arm.compat_key("trtllm")
    assert x86.compat_differences(arm, "trtllm") == {"platform": ("linux-x86_64", "linux-aarch64")}


@pytest.mark.parametrize("version,cuda_major", [("1.2.1", "13"), ("0.16", "12")])
def test_item_10_test_fingerprints_pair_versions_as_releases_ship(version, cuda_major):
    s = stack(version)
    fp = h100x8(version=version)
    assert fp.cuda_version.split(".")[0] == cuda_major == s["cuda"].split(".")[0]
    assert (fp.tensorrt_llm_version, fp.tensorrt_version, fp.cuda_version) == (s["tensorrt_llm"], s["tensorrt"], s["cuda"])
    from .. import test_fingerprint

    assert test_fingerprint.h100_host().cuda_version == stack()["cuda"], "the fingerprint tests use a 1.2.1 stack"


def test_item_11_memory_limit_watches_resident_memory(hf_model, fake_tools, prod, tmp_path, monkeypatch):
    data = yaml.safe_load(prod.read_text())
    data["engine"]["build_memory_limit_mb"] = 512
    profile = parse_profile(data)
    # CUDA-like: 4 GiB of address space reserved, little touched. RLIMIT_AS would kill this.
    monkeypatch.setenv("FAKE_TRTLLM_MODE", "reserve")
    TrtllmBackend(settings()).build(profile, hf_model, tmp_path / "ok", h100x8(), tmp_path / "log")
    assert "reserved 4 GiB of address space" in (tmp_path / "log").read_text()
    # A runaway CPU-side build is still stopped.
    monkeypatch.setenv("FAKE_TRTLLM_MODE", "oom")
    with pytest.raises(EngineBuildError) as exc:
        TrtllmBackend(settings()).build(profile, hf_model, tmp_path / "no", h100x8(), tmp_path / "log2")
    assert exc.value.kind == "memory" and "over its 512 MiB limit" in str(exc.value)
    assert not (tmp_path / "no").exists()


# -- preconditions before anything costly ---------------------------------------------------------

def test_build_on_a_host_that_cannot_build_exits_2_naming_every_unmet_requirement(cli, tmp_path, monkeypatch):
    """The seed's report: the 70B TP8 profile on a GPU-less host listed a 140 GB checkpoint in S3,
    then died on credentials with exit 1. Now: exit 2 first, naming everything, touching nothing
    (the store and the checkpoint's endpoint here do not even exist)."""
    bare = h100x8().model_copy(update={"gpus": (), "tensorrt_llm_version": None, "tensorrt_version": None})
    fp = tmp_path / "fp.json"
    fp.write_text(json.dumps(bare.model_dump(mode="json")))
    monkeypatch.setenv("BUILDCTL_FINGERPRINT_FILE", str(fp))
    monkeypatch.setenv("BUILDCTL_TRTLLM_EXAMPLES", str(tmp_path / "no-examples"))
    monkeypatch.setenv("BUILDCTL_TRTLLM_BUILD", "trtllm-build-not-installed")
    code, _, err = cli("--store", "s3://nowhere/x", "--endpoint-url", "http://127.0.0.1:9", "build",
                       PROFILES / "llama-3-70b-instruct-fp8-tp8.yaml")
    assert code == 2, err
    for needle in ("GPU count >= tp_size*pp_size = 8: this host has 0",
                   "TensorRT-LLM 1.2.1 (pinned) importable: not installed on this host",
                   f"converter script present: {tmp_path}/no-examples/quantization/quantize.py does not exist",
                   "trtllm-build executable: trtllm-build-not-installed is not found",
                   "calibration dataset /data/calibration/cnn_dailymail is a local directory"):
        assert needle in err, (needle, err)
    assert "s3://models" not in err and "endpoint" not in err


def test_flow_summary_lists_the_unmet_requirements():
    from buildctl.flows.summary import advice

    steps = advice(HostRequirementsError("p", ["GPU count >= 8: this host has 0", "trtllm-build executable"]), compat_key=None)
    assert len(steps) == 2 and steps[0].endswith("GPU count >= 8: this host has 0")


def test_pinned_version_mismatch_is_unmet(fake_tools, prod):
    unmet = TrtllmBackend(settings()).unmet_requirements(load_profile(prod), h100x8(version="0.16"))
    assert unmet == ["TensorRT-LLM 1.2.1 (pinned, BUILDCTL_TRTLLM_VERSION) importable: this host has 0.16.0"]


# -- the GPU acceptance runbook, dry run against the fakes -----------------------------------------

@pytest.mark.slow
def test_gpu_acceptance_dry_run(tmp_path):
    env = {**os.environ, "BUILDCTL_CACHE_DIR": str(tmp_path / "cache"),
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    r = subprocess.run(["bash", str(REPO / "scripts" / "gpu-acceptance.sh"), "--dry-run", "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    report = (tmp_path / "out" / "report.md").read_text()
    for step in ("fingerprint", "build tp1", "pull tp1", "generate tp1", "build tp2", "pull tp2", "generate tp2"):
        assert f"| {step} | ok |" in report, report
    assert "| validate tp1 | skipped (dry run" in report
    assert "DRY RUN against the contract fakes" in report
