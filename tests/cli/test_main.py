from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from buildctl.cli.main import EXIT_CODES, Terminated, exit_code_for
from buildctl.core import errors

from ..support.helpers import PROFILES, REPO

GOOD = PROFILES / "tiny-llama-cpu.yaml"


def test_fingerprint_json(cli):
    code, out, err = cli("fingerprint", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert "gpus" in data and data["cpu"]["machine"]


def test_global_json_flag(cli):
    code, out, _ = cli("--json", "fingerprint")
    assert code == 0 and json.loads(out)["schema_version"] == 1


def test_fingerprint_table(cli):
    code, out, _ = cli("fingerprint")
    assert code == 0 and "compat key (aoti)" in out


def test_profile_check_all_shipped(cli):
    code, out, err = cli("profile", "check", *sorted(PROFILES.glob("*.yaml")))
    assert code == 0, err
    assert out.count("ok ") == len(list(PROFILES.glob("*.yaml"))) == 5


def test_profile_show_json(cli):
    code, out, _ = cli("profile", "show", GOOD, "--json")
    data = json.loads(out)
    assert code == 0 and data["build_hash"].startswith("xxh3-128:")
    assert data["profile"]["engine"]["aoti"]["cpu_isa"] == "avx2"


CASES = {
    "unknown-key": ("engine:\n  backend: aoti\n  max_sequence_len: 3\n", "engine.max_sequence_len"),
    "wrong-type": ("engine:\n  backend: aoti\n  max_batch_size: eight\n", "engine.max_batch_size"),
    "input-gt-seq": ("engine:\n  backend: aoti\n  max_input_len: 9000\n", "engine.max_input_len"),
    "fp8-on-aoti": ("engine:\n  backend: aoti\n  quantization: fp8\n", "engine.quantization"),
    "yaml-syntax": ("engine: [backend: aoti\n", "YAML syntax error at line"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_profiles_exit_2(cli, tmp_path, case):
    body, expect = CASES[case]
    f = tmp_path / f"{case}.yaml"
    f.write_text("name: bad\nmodel:\n  tiny: {}\n" + body if case != "yaml-syntax" else body)
    code, out, err = cli("profile", "check", f)
    assert code == 2
    assert str(f) in err and expect in err
    assert "Traceback" not in err


def test_several_bad_files_all_reported(cli, tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("name: a\n")
    b.write_text("{{")
    code, _, err = cli("profile", "check", a, GOOD, b)
    assert code == 2 and str(a) in err and str(b) in err


def test_missing_profile_exit_3(cli, tmp_path):
    code, _, err = cli("profile", "show", tmp_path / "nope.yaml")
    assert code == 3 and "not found" in err


def test_usage_error_exit_2(cli):
    code, _, _ = cli("profile", "check")
    assert code == 2
    code, _, _ = cli("no-such-command")
    assert code == 2


def test_exit_code_table_covers_every_category():
    assert exit_code_for(errors.BadInputError("x")) == 2
    assert exit_code_for(errors.NotFoundError("x")) == 3
    assert exit_code_for(errors.IntegrityError("x")) == 4
    assert exit_code_for(errors.GateRefusedError("x")) == 5
    assert exit_code_for(errors.ConflictError("x")) == 6
    assert exit_code_for(errors.BuildFailedError("x")) == 7
    assert exit_code_for(errors.PreflightRefusedError("x")) == 8
    assert exit_code_for(errors.UnavailableError("x")) == 9
    assert exit_code_for(errors.EventNotDeliveredError("x")) == 11
    assert exit_code_for(errors.DestinationError("x")) == 12
    assert exit_code_for(RuntimeError("x")) == 1
    assert exit_code_for(KeyboardInterrupt()) == 130
    assert exit_code_for(Terminated()) == 143
    assert {code for _, code, _ in EXIT_CODES} == {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 130, 143}


def test_console_script_end_to_end(tmp_path):
    """The installed entry point: a real process, a real exit code, no traceback."""
    exe = os.path.join(os.path.dirname(sys.executable), "buildctl")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nmodel: {tiny: {}}\nengine: {backend: aoti, tp_size: 2}\n")
    r = subprocess.run([exe, "profile", "check", str(bad)], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2
    assert "engine.tp_size" in r.stderr and "aoti-single-rank" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([exe, "--json", "fingerprint"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0 and json.loads(r.stdout)["platform"]


def test_generate_reads_a_plain_tokenizer_json_without_transformers_and_gets_the_same_ids(tmp_path):
    """`buildctl generate --tokenizer` encodes with the tokenizers library when the directory's
    config adds no special tokens of its own (importing AutoTokenizer cost seconds per smoke
    check), with the same ids and text as AutoTokenizer; a config that adds them falls back."""
    import shutil

    from transformers import AutoTokenizer

    from buildctl.cli.build import _FastTokenizer, _load_tokenizer
    from buildctl.engines.profile import TinyModel
    from buildctl.engines.tiny import make_tiny
    from buildctl.core.settings import load_settings

    model = make_tiny(TinyModel(), load_settings().cache_dir)
    fast, slow = _load_tokenizer(model), AutoTokenizer.from_pretrained(str(model))
    assert isinstance(fast, _FastTokenizer)
    for text in ("A build pipeline turns", "", "engines, manifests and channels: 42 of them"):
        ids = fast(text)["input_ids"]
        assert ids == slow(text)["input_ids"]
        assert fast.decode(ids) == slow.decode(ids)
    bos = tmp_path / "bos"
    shutil.copytree(model, bos)
    config = json.loads((bos / "tokenizer_config.json").read_text())
    (bos / "tokenizer_config.json").write_text(json.dumps({**config, "add_bos_token": True}))
    assert not isinstance(_load_tokenizer(bos), _FastTokenizer)


# --- #48 items 10 and 11: bad inputs that exited 1 ----------------------------------------------

@pytest.mark.parametrize("body", ["platform: null\n", "cpu:\n  machine: x86_64\nplatform: null\n"])
def test_a_target_with_null_for_a_required_field_is_bad_input(tmp_path, cli, body):
    target = tmp_path / "t.yaml"
    target.write_text(body)
    code, _, err = cli("pull", "--profile", "p", "--channel", "prod", "--dest", tmp_path / "n",
                       "--for-upgrade", target, "--stage-only")
    assert code == 2 and "platform: null" in err and len(err.strip().splitlines()) == 1, err


def test_an_upgrade_target_that_applies_to_no_fingerprint_is_bad_input():
    from buildctl.engines.fingerprint import UpgradeTarget, detect
    from buildctl.engines.errors import UpgradeTargetError

    with pytest.raises(UpgradeTargetError):
        UpgradeTarget.model_construct(platform=None, _fields_set={"platform"}).apply(detect())


def test_a_target_file_without_end_is_refused_at_a_cap(cli, tmp_path):
    code, _, err = cli("upgrade", "plan", "--to", "/dev/zero")
    assert code == 2 and "larger than" in err, err


@pytest.mark.parametrize("url", ["notaurl", "http://[::1", "http://host:port", "ftp://host"])
def test_a_malformed_endpoint_url_is_bad_input_and_named(cli, url, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    code, _, err = cli("--store", "s3://bucket-x/p", "--endpoint-url", url, "ls")
    assert code == 2 and url in err and "--endpoint-url" in err, err


def test_key_generate_onto_a_file_is_bad_input(cli, tmp_path):
    f = tmp_path / "exists.key"
    f.write_text("")
    code, _, err = cli("key", "generate", "--role", "builder", "--out", f)
    assert code == 2 and "not a directory" in err, err


@pytest.mark.parametrize("args", [["key", "generate", "--role", "builder", "--out", "{ro}/keys"],
                                  ["model", "make-tiny", "{ro}/model"]])
def test_writing_onto_a_read_only_path_exits_12(cli, read_only_dir, args):
    if read_only_dir is None:
        pytest.skip("mounting a read-only tmpfs needs root")
    code, _, err = cli(*[a.format(ro=read_only_dir) for a in args])
    assert code == 12 and "Read-only file system" in err and len(err.strip().splitlines()) == 1, err
