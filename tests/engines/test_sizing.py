"""`buildctl profile suggest`: sizing from a synthetic traffic file whose right answer is computed
here, independently of the implementation (sorted lists, nearest rank, the KV formula by hand)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import yaml

from buildctl.engines.profile import load_profile

from ..support.helpers import REPO

TINY = REPO / "build_profiles" / "tiny-llama-cpu.yaml"
L8B = REPO / "build_profiles" / "llama-3-8b-instruct-fp8-tp1.yaml"


def nearest_rank(values, q):
    s = sorted(values)
    k = math.ceil(q * len(s))  # the k-th smallest has at least q of the values at or below it
    return s[k - 1]


def synthetic(path: Path, n: int = 2000, seed: int = 7, bad: int = 0):
    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        inp = int(rng.lognormvariate(5.0, 0.6))  # median ~150 tokens, a long tail
        out = rng.randint(1, 300)
        reqs.append({"input_tokens": inp, "output_tokens": out, "timestamp": 1_700_000_000 + i * 0.05,
                     "concurrency": rng.randint(1, 20)})
    lines = [json.dumps(r) for r in reqs]
    junk = ['{"input_tokens": -3, "output_tokens": 5}', "not json", '["a list"]',
            '{"input_tokens": 10}', '{"input_tokens": 5, "output_tokens": 2, "concurrency": 0}']
    for j in range(bad):
        lines.insert(rng.randrange(len(lines)), junk[j % len(junk)])
    path.write_text("\n".join(lines) + "\n")
    return reqs


def test_suggest_matches_an_independent_computation(tmp_path, cli):
    reqs = synthetic(tmp_path / "traffic.jsonl")
    code, out, err = cli("--json", "profile", "suggest", str(TINY), "--traffic", tmp_path / "traffic.jsonl")
    assert code == 0, err
    got = json.loads(out)
    ins = [r["input_tokens"] for r in reqs]
    outs = [r["output_tokens"] for r in reqs]
    tot = [a + b for a, b in zip(ins, outs)]
    for name, vals in (("input", ins), ("output", outs), ("total", tot)):
        assert got["lengths"][name] == {"p50": nearest_rank(vals, 0.5), "p90": nearest_rank(vals, 0.9),
                                        "p99": nearest_rank(vals, 0.99), "max": max(vals)}
    peak = max(r["concurrency"] for r in reqs)
    assert got["peak_concurrency"] == peak and got["peak_arrivals_per_s"] == 20  # one request every 50 ms
    rec = got["recommended"]
    seq = min(-(-max(tot) // 256) * 256, 2048)  # the tiny model's max_position_embeddings caps it
    prof = load_profile(TINY).engine, load_profile(TINY).validation.speed
    batch = max(math.ceil(peak * 1.25), max(prof[1].concurrency))  # raised to what its validation runs
    assert rec["max_seq_len"] == seq and rec["max_input_len"] == min(-(-max(ins) // 256) * 256, seq)
    assert rec["max_batch_size"] == batch and rec["vllm_max_num_seqs"] == batch and rec["vllm_max_model_len"] == seq
    assert rec["max_num_tokens"] == rec["max_input_len"] + batch - 1
    # KV: 2 x 2 layers x 2 KV heads x head dim 32 (128 / 4 heads) x 4 bytes (float32)
    per_token = 2 * 2 * 2 * 32 * 4
    kv = got["kv_cache"]
    assert kv["bytes_per_token_per_gpu"] == per_token
    reserved = prof[0].max_batch_size * prof[0].max_seq_len  # the profile's max_batch_size x max_seq_len
    assert kv["reserved_per_gpu"] == per_token * reserved
    assert kv["needed_per_gpu"] == per_token * peak * min(max(tot), seq)
    assert kv["over_provisioning"] == round(reserved / (peak * min(max(tot), seq)), 3)
    assert got["malformed"] == {} and got["rejected_by_recommendation"] == 0

    # coverage below 1 drops the tail, and says how many observed requests it would refuse
    code, out, _ = cli("--json", "profile", "suggest", str(TINY), "--traffic", tmp_path / "traffic.jsonl",
                       "--coverage", "0.99", "--round", "64")
    low = json.loads(out)
    seq99 = -(-nearest_rank(tot, 0.99) // 64) * 64
    in99 = min(-(-nearest_rank(ins, 0.99) // 64) * 64, seq99)
    assert low["recommended"]["max_seq_len"] == seq99 and low["recommended"]["max_input_len"] == in99
    assert low["rejected_by_recommendation"] == sum(1 for a, t in zip(ins, tot) if a > in99 or t > seq99) > 0


def test_an_fp8_profile_with_its_model_config_and_the_patched_file(tmp_path, cli):
    """The 8B fp8 profile with a Llama-3-8B-shaped config: fp8 KV is 1 byte; the patched profile
    loads and carries the recommended limits."""
    synthetic(tmp_path / "t.jsonl", n=500)
    config = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
              "max_position_embeddings": 8192}
    (tmp_path / "config.json").write_text(json.dumps(config))
    code, out, err = cli("--json", "profile", "suggest", str(L8B), "--traffic", tmp_path / "t.jsonl",
                         "--model-config", tmp_path / "config.json", "--write", tmp_path / "sized.yaml")
    assert code == 0, err
    got = json.loads(out)
    prof = load_profile(L8B)
    width = 1 if prof.engine.kv_cache_dtype == "fp8" else 2
    per_token = 2 * 32 * math.ceil(8 / prof.engine.tp_size) * 128 * width
    assert got["kv_cache"]["bytes_per_token_per_gpu"] == per_token
    assert got["kv_cache"]["reserved_per_gpu"] == per_token * prof.engine.max_batch_size * prof.engine.max_seq_len
    assert got["recommended"]["max_batch_size"] == max(prof.validation.speed.concurrency)  # its validation must fit
    assert any("validation's highest speed concurrency" in n for n in got["notes"])
    sized = load_profile(tmp_path / "sized.yaml")
    assert sized.engine.max_seq_len == got["recommended"]["max_seq_len"]
    assert sized.engine.max_batch_size == got["recommended"]["max_batch_size"]
    assert sized.reference.max_model_len == got["recommended"]["vllm_max_model_len"]
    assert yaml.safe_load((tmp_path / "sized.yaml").read_text())["name"] == prof.name
    code, _, err = cli("profile", "suggest", str(L8B), "--traffic", tmp_path / "t.jsonl",
                       "--model-config", tmp_path / "config.json", "--write", tmp_path / "sized.yaml")
    assert code == 2 and "refusing to overwrite" in err  # never overwrites a file


def test_malformed_lines_are_counted_and_only_fatal_over_the_threshold(tmp_path, cli):
    synthetic(tmp_path / "t.jsonl", n=1000, bad=5)  # 5 of 1005 lines: under the default 1%
    code, out, err = cli("--json", "profile", "suggest", str(TINY), "--traffic", tmp_path / "t.jsonl")
    assert code == 0, err
    bad = json.loads(out)["malformed"]
    assert {k: v["count"] for k, v in bad.items()} == {
        "input_tokens is not a non-negative integer": 1, "not JSON": 1, "not a JSON object": 1,
        "no output_tokens or completion_tokens": 1, "concurrency is not a positive integer": 1}
    assert json.loads(out)["requests"] == 1000
    code, out, _ = cli("profile", "suggest", str(TINY), "--traffic", tmp_path / "t.jsonl")
    assert code == 0 and "5 malformed line(s) skipped" in out and "provisioned" in out
    synthetic(tmp_path / "worse.jsonl", n=100, bad=5)  # 5 of 105: over 1%
    code, _, err = cli("profile", "suggest", str(TINY), "--traffic", tmp_path / "worse.jsonl")
    assert code == 2 and "5 of 105 lines are malformed" in err and "not JSON: 1 (line" in err
    code, _, err = cli("profile", "suggest", str(TINY), "--traffic", tmp_path / "worse.jsonl", "--max-bad-fraction", "0.05")
    assert code == 0, err
    (tmp_path / "empty.jsonl").write_text("\n\n")
    code, _, err = cli("profile", "suggest", str(TINY), "--traffic", tmp_path / "empty.jsonl")
    assert code == 2 and "no usable request" in err
    # OpenAI usage names are read too; no concurrency: max_batch_size kept
    (tmp_path / "openai.jsonl").write_text('{"prompt_tokens": 100, "completion_tokens": 20}\n')
    code, out, err = cli("--json", "profile", "suggest", "tiny-llama-cpu", "--traffic", tmp_path / "openai.jsonl")
    got = json.loads(out)
    kept = load_profile(TINY).engine.max_batch_size
    assert code == 0 and got["recommended"]["max_batch_size"] == kept and got["peak_concurrency"] is None, err
    assert any("no concurrency" in n for n in got["notes"])
