"""Tests that bite: each kills a mutant of the guard code that the suite once let through (#20).

* a tail-latency regression (same median TTFT, 10x the p99) fails the speed gate;
* create-only writes lose to a writer that created the key between the check and the write, on both stores;
* build and compat keys change with each input, one at a time, and only with those;
* the trtllm checkpoint argv for every quantization x KV dtype the schema allows, exactly, and
  accepted by the release's own argument parser (the contract fixtures);
* pull refuses a corrupted first, middle or last file, and (a property) any single-byte change in
  any file, leaving ``current`` unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

import buildctl.artifact_store as ops
from buildctl.engines.backend import TokenEvent
from buildctl.engines.buildkey import build_key, build_key_for
from buildctl.engines.errors import HostRequirementsError, ProfileError
from buildctl.engines.profile import SpeedGate, load_profile
from buildctl.engines.trtllm import RELEASES, TrtllmTools, convert_command
from buildctl.artifact_store.errors import VerificationError
from buildctl.artifact_store.pull import current_artifact, install_artifact
from buildctl.validators.speed import measure

from .conftest import PROFILES, make_tree
from .fakes.contract import parser as contract_parser
from .trtllm_kit import h100x8

# --- the speed gate looks at the tail ----------------------------------------------------------


class TailRunner:
    """Every request's first token after ``base_s``, except the last ``tail`` requests of each
    run, after ``base_s * factor``: the median request is as fast as the reference's, the tail is not."""

    name = "tail"

    def __init__(self, base_s: float, factor: float = 1.0, tail: int = 0) -> None:
        self.base_s, self.factor, self.tail = base_s, factor, tail

    def stream(self, prompts, max_tokens, concurrency):
        n = len(prompts)
        for i in range(n):
            ttft = self.base_s * (self.factor if i >= n - self.tail else 1.0)
            yield TokenEvent(i, None, 100.0)
            for t in range(max_tokens):
                yield TokenEvent(i, 1, 100.0 + ttft + 0.001 * t)


def test_same_median_ten_times_the_p99_fails_the_ttft_gate():
    gate = SpeedGate(min_throughput_ratio=1e-9, max_p99_ttft_ratio=1.5, max_p50_ttft_ratio=1.0, concurrency=(1,),
                     input_len=4, output_len=2, num_prompts=100, repetitions=6, max_repetitions=6, max_seconds=1e6,
                     warmup=0)
    cand, ref = TailRunner(0.010, factor=12.0, tail=3), TailRunner(0.010)
    rep = measure(cand, ref, gate, [[1]] * 100)
    lv = rep.levels[0]
    assert lv.ratio("ttft_p50").interval.median == pytest.approx(1.0)  # the median is the same
    assert lv.ratio("ttft_p99").interval.median > 9.0  # the tail is about 10x
    assert rep.verdict == "fail" and any("p99 TTFT ratio" in r and "fails" in r for r in rep.reasons())
    same = measure(TailRunner(0.010), TailRunner(0.010), gate, [[1]] * 100)
    assert same.verdict == "pass"  # the gate is not failing everything


# --- create-only writes lose a race they did not see coming ------------------------------------


def _race_local(store, monkeypatch, key: str, theirs: bytes) -> None:
    """The competitor creates ``key`` after this writer's existence check, right before its link."""
    import os

    real_link = os.link
    target = store.root / key

    def racing_link(src, dst, *a, **kw):
        if Path(dst) == target and not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(theirs)
        return real_link(src, dst, *a, **kw)

    monkeypatch.setattr(os, "link", racing_link)


def _race_s3(store, monkeypatch, key: str, theirs: bytes) -> None:
    """The competitor's PUT lands right before this writer's conditional PUT or multipart completion."""
    client, full = store.client, store.prefix + key
    done = []

    def first(name):
        real = getattr(client, name)

        def call(*a, **kw):
            if kw.get("Key") == full and not done:
                done.append(1)
                real_put(Bucket=store.bucket, Key=full, Body=theirs)
            return real(*a, **kw)

        return call

    real_put = client.put_object
    for name in ("put_object", "complete_multipart_upload", "upload_part", "create_multipart_upload"):
        monkeypatch.setattr(client, name, first(name))


@pytest.mark.parametrize("how", ["put_bytes", "put_file"])
def test_create_only_write_loses_to_a_writer_between_check_and_write(store, tmp_path, monkeypatch, how):
    key, theirs, ours = "blobs/ab/" + "ab" * 16, b"the other writer's bytes", b"our bytes, never written"
    (_race_local if store.uri.startswith("file://") else _race_s3)(store, monkeypatch, key, theirs)
    if how == "put_bytes":
        created = store.put_bytes(key, ours)
    else:
        (tmp_path / "f").write_bytes(ours)
        created = store.put_file(key, tmp_path / "f", size=len(ours))
    assert created is False
    assert store.get_bytes(key) == theirs  # never overwritten


# --- build and compat keys: one input at a time ------------------------------------------------

BASE = {"profile_hash": "xxh3-128:" + "1" * 32, "model_digest": "xxh3-128:" + "2" * 32, "compat_key": "aoti-x",
        "version": "2.9.0"}


def test_build_key_changes_with_each_input_and_nothing_else():
    base = build_key(**BASE)
    assert build_key(**BASE) == base
    for field, other in (("profile_hash", "xxh3-128:" + "3" * 32), ("model_digest", "xxh3-128:" + "4" * 32),
                         ("compat_key", "aoti-y"), ("version", "2.9.1"), ("version", None)):
        assert build_key(**{**BASE, field: other}) != base, field


def test_build_key_for_follows_profile_model_compat_and_tool_version():
    prof = load_profile(PROFILES / "llama-3-8b-instruct-fp8-tp1.yaml")
    fp = h100x8()
    base = build_key_for(prof, BASE["model_digest"], fp)
    assert build_key_for(prof, BASE["model_digest"], fp) == base
    other_prof = prof.model_copy(update={"engine": prof.engine.model_copy(update={"max_batch_size": 3})})
    assert build_key_for(other_prof, BASE["model_digest"], fp) != base
    assert build_key_for(prof, "xxh3-128:" + "9" * 32, fp) != base
    for field, value in (("driver_version", "999.1"), ("tensorrt_llm_version", "1.2.2"), ("cuda_version", "14.0")):
        assert build_key_for(prof, BASE["model_digest"], fp.model_copy(update={field: value})) != base, field
    for field, value in (("torch_version", "0.0.1"), ("glibc_version", "9.99"), ("compiler_version", "gcc 99.0.0")):
        assert build_key_for(prof, BASE["model_digest"], fp.model_copy(update={field: value})) == base, field


# (field, new value, changes the trtllm key, changes the aoti key)
ONE_AT_A_TIME = (
    ("driver_version", "{major5}.10", True, False),  # a new driver branch
    ("driver_version", "{major}.99", False, False),  # a patch within the branch
    ("cuda_version", "99.0", True, False),
    ("tensorrt_version", "99.1.0", True, False),
    ("tensorrt_llm_version", "9.9.9", True, False),
    ("torch_version", "0.0.1", False, True),
    ("compiler_version", "gcc 99.1.0", False, True),
    ("compiler_version", "{compiler_major}.99.99", False, False),  # same major
    ("platform", "linux-riscv64", True, True),
    ("glibc_version", "9.99", False, False),
)


def test_compat_keys_change_with_each_compat_field_and_only_those():
    fp = h100x8().model_copy(update={"torch_version": "2.9.0", "compiler_version": "gcc 12.2.0"})
    major = fp.driver_version.split(".")[0]
    subs = {"major5": str(int(major) + 5), "major": major, "compiler_major": fp.compiler_version.split(".")[0]}
    for field, value, trt, aoti in ONE_AT_A_TIME:
        changed = fp.model_copy(update={field: value.format(**subs)})
        assert (changed.compat_key("trtllm") != fp.compat_key("trtllm")) is trt, (field, value)
        assert (changed.compat_key("aoti") != fp.compat_key("aoti")) is aoti, (field, value)
    cpu = fp.model_copy(update={"cpu": fp.cpu.model_copy(update={"isa_level": "x86-64-v2"})})
    assert cpu.compat_key("aoti") != fp.compat_key("aoti") and cpu.compat_key("trtllm") == fp.compat_key("trtllm")
    gpus = fp.model_copy(update={"gpus": tuple(g.model_copy(update={"sm": "8.9"}) for g in fp.gpus)})
    assert gpus.compat_key("trtllm") != fp.compat_key("trtllm") and gpus.compat_key("aoti") == fp.compat_key("aoti")


# --- trtllm checkpoint argv, exactly ------------------------------------------------------------

QUANTS = ("none", "fp8", "int8_sq", "int4_awq", "w4a8_awq", "int8_wo", "int4_wo")
KVS = ("auto", "fp8", "int8", "fp16", "bf16")
PY, EX, CALIB = "/usr/bin/python3", "/app/tensorrt_llm/examples", "/data/calibration/cnn_dailymail"
COMMON = ["--model_dir", "/m", "--output_dir", "/c", "--dtype", "float16", "--tp_size", "1", "--pp_size", "1"]


def expected_argv(series: str, q: str, kv: str) -> list[str] | str:
    """By hand, from the fixtures' facts: which script, which flags (or why it is refused)."""
    if kv in ("fp16", "bf16"):
        return "profile"  # the KV cache follows the model dtype unless quantized: refused at load
    convert = f"{EX}/models/core/llama/convert_checkpoint.py" if series == "1.2" else f"{EX}/llama/convert_checkpoint.py"
    if q == "none":
        argv = [PY, convert, *COMMON]
        if kv == "fp8":
            if series == "0.16":
                return "host"  # 0.16's converter has no fp8 KV flag
            argv.append("--fp8_kv_cache")
        if kv == "int8":
            argv += ["--int8_kv_cache", "--calib_dataset", CALIB]
            if series == "1.2":
                argv += ["--calib_size", "64"]
        return argv
    argv = [PY, f"{EX}/quantization/quantize.py", *COMMON, "--qformat", q, "--calib_dataset", CALIB, "--calib_size", "64"]
    if kv in ("fp8", "int8"):
        argv += ["--kv_cache_dtype", kv]
    return argv


@pytest.mark.parametrize("series", [r.series for r in RELEASES])
@pytest.mark.parametrize("q", QUANTS)
@pytest.mark.parametrize("kv", KVS)
def test_checkpoint_argv_for_every_quantization_and_kv_dtype(tmp_path, series, q, kv):
    import yaml

    data = yaml.safe_load((PROFILES / "llama-3-8b-instruct-fp8-tp1.yaml").read_text())
    data["model"]["dtype"] = "float16"
    data["engine"].update({"quantization": q, "kv_cache_dtype": kv, "tp_size": 1, "pp_size": 1,
                           "calibration": {"dataset": CALIB, "size": 64}})
    if q != "fp8":  # fp8 context FMHA needs fp8 quantization
        data["engine"]["plugins"] = {**(data["engine"].get("plugins") or {}), "use_fp8_context_fmha": False}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    want = expected_argv(series, q, kv)
    if want == "profile":
        with pytest.raises(ProfileError, match=f"kv_cache_dtype '{kv}' with quantization '{q}'.*trtllm-kv-cache-dtype"):
            load_profile(path)
        return
    prof = load_profile(path)
    release = next(r for r in RELEASES if r.series == series)
    tools = TrtllmTools(convert=f"{EX}/{release.convert_script}", quantize=f"{EX}/{release.quantize_script}",
                       build="trtllm-build", python=PY, release=release)
    if want == "host":
        with pytest.raises(HostRequirementsError, match="no fp8 KV-cache flag"):
            convert_command(prof, Path("/m"), Path("/c"), tools)
        return
    got = convert_command(prof, Path("/m"), Path("/c"), tools)
    assert got == want
    # and the release's own argument parser (the contract fixture) accepts it
    version = "1.2.1" if series == "1.2" else "0.16"
    tool = "convert_checkpoint" if q == "none" else "quantize"
    contract_parser(version, tool).parse_args(got[2:])


# --- pull refuses any corrupted file, wherever it sorts -----------------------------------------


def _tree(root: Path) -> Path:
    return make_tree(root, {"a-first.json": b'{"first": 1}', "m-middle.bin": 70_000, "z-last.engine": 90_000}, seed=3)


@pytest.mark.parametrize("which", ["a-first.json", "m-middle.bin", "z-last.engine"])
def test_pull_refuses_a_corrupted_first_middle_or_last_file(store, tmp_path, draft, which):
    from .conftest import rot

    good = ops.publish_tree(store, make_tree(tmp_path / "good", {"x": b"good"}), draft).artifact_id
    dest = tmp_path / "node"
    install_artifact(store, good, dest)
    bad = ops.publish_tree(store, _tree(tmp_path / "bad"), draft).artifact_id
    rot(store, next(f.digest for f in ops.get_manifest(store, bad).files if f.path == which), "flip")
    with pytest.raises(VerificationError) as exc:
        install_artifact(store, bad, dest)
    assert [p.path for p in exc.value.problems] == [which]
    assert current_artifact(dest) == good and not list(dest.glob(".staging-*"))


@hsettings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_single_byte_change_in_any_file_is_refused(tmp_path_factory, draft, data):
    """Property: for a small tree, any file and any byte of it changed to any other value: the pull
    is refused naming that file, and ``current`` stays what it was."""
    from buildctl.artifact_store.backend import open_store
    from buildctl.artifact_store.layout import blob_key

    root = tmp_path_factory.mktemp("prop")
    store = open_store("file://" + str(root / "store"))
    files = data.draw(st.dictionaries(st.sampled_from(["a", "b/c.bin", "d.json", "z"]), st.binary(min_size=1, max_size=64),
                                      min_size=1, max_size=4))
    src = make_tree(root / "tree", files)
    good = ops.publish_tree(store, make_tree(root / "good", {"g": b"good"}), draft).artifact_id
    install_artifact(store, good, root / "node")
    aid = ops.publish_tree(store, src, draft).artifact_id
    m = ops.get_manifest(store, aid)
    entry = data.draw(st.sampled_from(sorted(m.files, key=lambda f: f.path)))
    blob = store.root / blob_key(entry.digest)
    body = bytearray(blob.read_bytes())
    i = data.draw(st.integers(0, len(body) - 1))
    body[i] = (body[i] + data.draw(st.integers(1, 255))) % 256
    blob.chmod(0o644)
    blob.write_bytes(bytes(body))
    with pytest.raises(VerificationError) as exc:
        install_artifact(store, aid, root / "node")
    assert {p.path for p in exc.value.problems} == {f.path for f in m.files if f.digest == entry.digest}
    assert current_artifact(root / "node") == good
    json.dumps([p.path for p in exc.value.problems])  # the report is plain data
