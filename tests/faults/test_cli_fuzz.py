"""#29 item 7: every CLI command, driven with generated bad arguments and bad settings, gives a
documented exit code with a one-line error: never 1 ("unexpected error") and never a traceback.

The commands come from the typer app itself, so a new command is fuzzed without being listed
here. Each example picks one command and, for each of its parameters, leaves it out or gives it a
value from a pool of bad ones (huge, non-finite, negative, malformed, a path that is a file, a
directory, missing, read-only, under a file, a file that is not JSON or JSON of the wrong shape).
The store is a real local store holding one artifact on staging, so commands get past "not
found" into their real work. Commands whose valid arguments start long work (a build, a
validation, a model training, a worker, an upgrade's builds) are fuzzed on their arguments only
(``--help`` stays out), with a store that refuses the work: they are listed in ``LONG``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import typer
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from .conftest import scale

# Commands that start minutes of work when their arguments happen to be valid: left out.
LONG = {("build",), ("validate",), ("model", "make-tiny"), ("worker", "start"), ("upgrade", "prepare"),
        ("generate",)}
COUNTS: dict[str, int] = {"examples": 0, "exit_1": 0, "tracebacks": 0}


def traceback_of_buildctl(err: str) -> bool:
    """A traceback through buildctl's code (a test server's thread elsewhere in this process, e.g.
    a proxy from an earlier test printing a broken pipe, is not the command's)."""
    return "Traceback" in err and "/buildctl/" in err


def commands() -> list[tuple[tuple[str, ...], list]]:
    from buildctl.cli.main import app

    out = []

    def walk(c, path=()):
        if hasattr(c, "commands"):
            for name, sub in c.commands.items():
                walk(sub, path + (name,))
        elif path not in LONG:
            out.append((path, [p for p in c.params if p.name != "help"]))

    walk(typer.main.get_command(app))
    return out


def bad_values(tmp: Path, artifact: str) -> list[str]:
    (tmp / "a-file").write_text("not a directory")
    (tmp / "not-json.json").write_bytes(b"\x00\xff{not json")
    (tmp / "wrong-shape.json").write_text(json.dumps([1, {"a": None}]))
    (tmp / "garbage.yaml").write_bytes(os.urandom(64))
    ro = tmp / "read-only"
    ro.mkdir(exist_ok=True)
    ro.chmod(0o555)
    return ["", "-1", "0", "1e400", "-1e400", "nan", "inf", "1e300", "99999999999999999999", "99999999999d", "1e26",
            "abc", "../x", "/", "a" * 300, "é", "s3://Bad_Bucket/x", "ftp://x", "xxh3-128:zz", artifact,
            artifact[9:25], "prod", "staging", "tiny-llama-cpu", "1,2,3", "1,a", "5,30,100", "0,1%,2%",
            str(tmp / "a-file"), str(tmp / "a-file" / "under"), str(tmp / "missing"), str(tmp),
            str(ro), str(ro / "sub"), str(tmp / "not-json.json"), str(tmp / "wrong-shape.json"),
            str(tmp / "garbage.yaml"), "2026-13-45T99:00:00Z", "1h", "30m"]


@pytest.fixture(scope="module")
def fuzz_env(tmp_path_factory):
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.engines.fingerprint import detect
    from buildctl.engines.profile import load_profile
    from buildctl.steps.build import manifest_draft

    from ..support.helpers import PROFILES, publish_files, staged

    root = tmp_path_factory.mktemp("cli-fuzz")
    store = open_store(f"file://{root}/store")
    draft = manifest_draft(load_profile(PROFILES / "tiny-llama-cpu.yaml"), detect())
    aid = publish_files(store, root / "tree", draft, {"rank0.engine": 4096, "config.json": b"{}"})
    staged(store, aid)
    yield root, store.uri, aid
    if (root / "read-only").exists():
        (root / "read-only").chmod(0o755)


@pytest.mark.parametrize("batch", range(3))
def test_every_command_given_bad_arguments_exits_with_a_documented_code(fuzz_env, batch, capsys, monkeypatch):
    from buildctl.cli.main import run

    root, uri, aid = fuzz_env
    cmds = commands()
    pool = bad_values(root, aid)
    monkeypatch.setenv("BUILDCTL_STORE", uri)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.chdir(root)

    @hsettings(max_examples=scale(60), deadline=None, derandomize=True, database=None,
               suppress_health_check=list(HealthCheck))
    @given(st.data())
    def one(data):
        path, params = data.draw(st.sampled_from(cmds[batch::3]))
        args = list(path)
        for p in params:
            if not data.draw(st.booleans()):
                continue
            flag = p.opts[0] if getattr(p, "opts", None) and p.param_type_name == "option" else None
            if flag is not None and getattr(p, "is_flag", False):
                args.append(flag)
                continue
            value = data.draw(st.sampled_from(pool))
            args += [flag, value] if flag else [value]
        code = run(args)
        captured = capsys.readouterr()
        COUNTS["examples"] += 1
        COUNTS["exit_1"] += code == 1
        COUNTS["tracebacks"] += traceback_of_buildctl(captured.err)
        assert code != 1 and not traceback_of_buildctl(captured.err), (args, code, captured.err[-600:])
        if code not in (0, 130, 143):
            assert captured.err.strip(), (args, code)

    one()


SETTINGS = ["BUILDCTL_RECORD_TTL_S", "BUILDCTL_VERIFY_WINDOW_S", "BUILDCTL_GC_GRACE_S", "BUILDCTL_GC_DELETE_WINDOW_S",
            "BUILDCTL_BUILD_SLOTS", "BUILDCTL_STORE", "BUILDCTL_SIGNING_KEY", "BUILDCTL_TRUSTED_KEYS",
            "BUILDCTL_FINGERPRINT_FILE", "BUILDCTL_PROFILE_DIR"]


def test_bad_settings_exit_2_for_every_command_that_reads_them(fuzz_env, capsys, monkeypatch):
    """A bad BUILDCTL_* value (overflowing, non-finite, a file that is not a key) is exit 2 naming
    the setting, whichever command reads it."""
    from buildctl.cli.main import run

    root, uri, aid = fuzz_env
    pool = bad_values(root, aid)
    monkeypatch.chdir(root)
    if not (root / "keys" / "promoter.key").exists():
        assert run(["key", "generate", "--out", str(root / "keys"), "--role", "promoter"]) == 0

    @hsettings(max_examples=scale(60), deadline=None, derandomize=True, database=None,
               suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(SETTINGS), st.sampled_from(pool),
           st.sampled_from([["ls"], ["history", "--profile", "tiny-llama-cpu", "--channel", "staging"],
                            ["promote", aid, "--channel", "staging"], ["gc", "--dry-run"], ["scrub"],
                            ["show", aid], ["verify", aid, "--deep"]]))
    def one(name, value, args):
        monkeypatch.setenv("BUILDCTL_STORE", uri)
        monkeypatch.setenv("BUILDCTL_SIGNING_KEY", str(root / "keys" / "promoter.key"))  # records get expiries
        monkeypatch.setenv(name, value)
        code = run(args)
        captured = capsys.readouterr()
        monkeypatch.delenv(name)
        COUNTS["examples"] += 1
        COUNTS["exit_1"] += code == 1
        COUNTS["tracebacks"] += traceback_of_buildctl(captured.err)
        assert code != 1 and not traceback_of_buildctl(captured.err), (name, value, args, code, captured.err[-600:])

    one()


def test_fuzz_counts_recorded(record_fault, worker_id):
    """Runs after the fuzz tests of this module: their counts go into the fault matrix. Over
    pytest-xdist workers (``make test``) the fuzz tests may have run in the other worker, whose
    counts this one cannot see; in one process (``make faults``) they always ran before it."""
    if not COUNTS["examples"] and worker_id != "master":
        pytest.skip(f"the fuzz tests of this module ran in another xdist worker than {worker_id}")
    assert COUNTS["examples"], "the fuzz tests ran before this one"
    record_fault("CLI property test: generated bad arguments and settings, every command",
                 f"{COUNTS['examples']} runs; exit 1: {COUNTS['exit_1']}; tracebacks: {COUNTS['tracebacks']}",
                 COUNTS["examples"], outcome="ok" if not COUNTS["exit_1"] and not COUNTS["tracebacks"] else "FAILED")


@pytest.mark.parametrize("env,args,needle", [
    ({"BUILDCTL_RECORD_TTL_S": "1e300"}, ["ls"], "record_ttl_s"),
    ({"BUILDCTL_VERIFY_WINDOW_S": "1e400"}, ["ls"], "verify_window_s"),
    ({"BUILDCTL_GC_GRACE_S": "inf"}, ["ls"], "gc_grace_s"),
    ({"BUILDCTL_BUILD_SLOTS": "99999999999999999999"}, ["ls"], "build_slots"),
    ({}, ["gc", "--quarantine-retention", "99999999999d"], "at most"),
    ({}, ["promote", "ARTIFACT", "--channel", "staging", "--trust-verify-within", "99999999999d"], "at most"),
    ({}, ["profile", "check", "PROFILE:max_seq_len=1.0e+26"], "max_seq_len"),
    ({}, ["profile", "check", "PROFILE:build_timeout_s=1.0e+400"], "build_timeout_s"),
    ({}, ["profile", "check", "PROFILE:max_batch_size=1.0e+12"], "max_batch_size"),
])
def test_numbers_are_bounded_where_they_are_parsed(fuzz_env, capsys, monkeypatch, env, args, needle):
    """#29 item 7: an overflowing or non-finite number is exit 2 naming the field, where it is
    parsed, instead of being accepted (and failing later, or never)."""
    import yaml

    from buildctl.cli.main import run

    from ..support.helpers import PROFILES

    root, uri, aid = fuzz_env
    monkeypatch.setenv("BUILDCTL_STORE", uri)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    out = []
    for a in args:
        if a == "ARTIFACT":
            a = aid
        elif a.startswith("PROFILE:"):
            field, value = a[len("PROFILE:"):].split("=")
            prof = yaml.safe_load((PROFILES / "tiny-llama-cpu.yaml").read_text())
            prof["engine"][field] = value
            f = root / f"bounded-{field}.yaml"
            f.write_text(yaml.safe_dump(prof).replace(f"'{value}'", value))
            a = str(f)
        out.append(a)
    code = run(out)
    err = capsys.readouterr().err
    assert code == 2 and needle in err, (out, code, err)
