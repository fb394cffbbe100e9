"""#29: one malformed record of any kind, and the store-wide commands (gc, scrub, ls, history,
rollout status) go on: they name it (exit 10) or do not read it (exit 0), never exit 1, never a
traceback, and gc removes nothing that record might guard."""

from __future__ import annotations

import json
import random
import shutil

import pytest

from buildctl.artifact_store.promotion import promote
from buildctl.artifact_store.backends.store import open_store
from buildctl.artifact_store.upkeep.integrity import verify_deep_or_quarantine
from buildctl.artifact_store.trust.revocation import Revocation
from buildctl.core.digest import canonical_json, digest_bytes
from buildctl.artifact_store.layout import (
    NODES,
    REVOCATIONS,
    TOUCHES,
    attestation_prefix,
    channel_key,
    history_prefix,
    pending_key,
    quarantine_prefix,
    revocation_key,
    verification_prefix,
)

from ..support.helpers import overwrite, publish_files, staged
from .conftest import scale

KINDS = ["channel ref", "history", "quarantine", "verification", "touch", "inventory", "pending", "revocation",
         "attestation"]
COMMANDS = [["--json", "gc", "--dry-run", "--keep", "0", "--grace", "0s"], ["--json", "scrub"], ["--json", "ls"],
            ["history", "--profile", "tiny-llama-cpu", "--channel", "prod"],
            ["rollout", "status", "--profile", "tiny-llama-cpu", "--channel", "prod"]]
GARBAGE = [b'{"seq": "not a record"', b"", b"\xff\xfe\x00garbage", b"[]", b'{"action": "lift"}', b"null"]


@pytest.fixture(scope="module")
def base(tmp_path_factory, draft_module):
    from buildctl.artifact_store.trust.authority import Authority
    from buildctl.artifact_store.quarantine import quarantine

    root = tmp_path_factory.mktemp("records")
    store = open_store(f"file://{root}/store")
    draft = draft_module
    a = publish_files(store, root / "a", draft, {"config.json": b"{}", "rank0.engine": 4096}, seed=1)
    b = publish_files(store, root / "b", draft, {"config.json": b"[]", "rank0.engine": 4096}, seed=2)
    promote(store, staged(store, a), "prod")
    verify_deep_or_quarantine(store, b, detector="test")
    quarantine(store, b, "suspect", auth=Authority(who="test"))
    ref = store.get_ref(channel_key(draft.profile_name, "prod", draft.compat_key))[0]
    store.cas(pending_key(draft.profile_name, "prod", draft.compat_key), ref, None)  # a well-formed proposal
    rev = canonical_json(Revocation(key_id="k", revoked_at="2026-01-01T00:00:00Z", reason="test", who="test",
                                    when="2026-01-01T00:00:00Z").model_dump(mode="json"))  # unsigned: counts for nothing
    store.put_bytes(revocation_key("2026-01-01T00:00:00Z", digest_bytes(rev)), rev)
    from buildctl.steps import fleet
    from buildctl.engines.fingerprint import detect

    fleet.report_node(store, "gpu-1", detect(), [draft.profile_name])
    return root, draft, a, b


@pytest.fixture(scope="module")
def draft_module():
    from buildctl.engines.fingerprint import detect
    from buildctl.engines.profile import load_profile
    from buildctl.steps.build import manifest_draft

    from ..support.helpers import PROFILES

    return manifest_draft(load_profile(PROFILES / "tiny-llama-cpu.yaml"), detect())


def record_of(store, kind: str, draft, a: str, b: str) -> str:
    prefix = {"channel ref": channel_key(draft.profile_name, "prod", draft.compat_key),
              "history": history_prefix(draft.profile_name, "prod", draft.compat_key),
              "quarantine": quarantine_prefix(b), "verification": verification_prefix(b), "touch": TOUCHES,
              "inventory": NODES, "pending": pending_key(draft.profile_name, "prod", draft.compat_key),
              "revocation": REVOCATIONS, "attestation": attestation_prefix(a)}[kind]
    keys = [k for k in store.list(prefix)]
    assert keys, kind
    return keys[0]


def test_a_malformed_record_of_each_kind_never_stalls_store_wide_commands(base, tmp_path, cli, record_fault):
    root, draft, a, b = base
    rng = random.Random(29)
    runs = 0
    for kind in KINDS:
        for i in range(scale(2)):
            d = tmp_path / f"{kind.replace(' ', '-')}-{i}"
            shutil.copytree(root / "store", d)
            store = open_store(f"file://{d}")
            key = record_of(store, kind, draft, a, b)
            overwrite(store, key, rng.choice(GARBAGE))
            for args in COMMANDS:
                code, out, err = cli("--store", d, *args)
                runs += 1
                assert code != 1 and "Traceback" not in err, (kind, key, args, code, err[-500:])
                assert code in (0, 3, 10), (kind, key, args, code, err[-500:])  # done, nothing there, or skipped
                if args[1] == "gc":
                    assert a not in json.loads(out)["removed_artifacts"], (kind, key)  # prod's artifact stays
    record_fault("malformed record of each kind", f"{len(KINDS)} kinds ({', '.join(KINDS)}), one record garbled, "
                 "then gc, scrub, ls, history, rollout status: never exit 1, prod's artifact never removed", runs)


def scrub_skipped(cli, store_dir) -> tuple[int, set[str], str]:
    code, out, err = cli("--store", store_dir, "--json", "scrub")
    assert code != 1 and "Traceback" not in err, (code, err[-500:])
    return code, {s["key"] for s in json.loads(out)["skipped_records"]}, err


def test_scrub_names_a_malformed_record_of_every_kind(base, tmp_path, cli):
    """scrub reads every small record the store keeps, whatever its kind, and names each one it
    cannot parse with its key (exit 10): the one command that reports what the others pass over."""
    root, draft, a, b = base
    rng = random.Random(2929)
    for kind in KINDS:
        d = tmp_path / kind.replace(" ", "-")
        shutil.copytree(root / "store", d)
        store = open_store(f"file://{d}")
        key = record_of(store, kind, draft, a, b)
        overwrite(store, key, rng.choice(GARBAGE))
        code, skipped, err = scrub_skipped(cli, d)
        assert code == 10 and key in skipped, (kind, key, code, skipped, err[-300:])
    code, skipped, _ = scrub_skipped(cli, root / "store")
    assert code == 0 and not skipped  # the well-formed store: nothing reported


def mutations(raw: dict, rng: random.Random) -> list[tuple[str, dict]]:
    """Field-level mutations of one record, each of which its schema refuses: an unknown field, a
    field of the wrong type, a string field with its type changed to a number."""
    field = rng.choice(sorted(raw))
    return [("unknown field", {**raw, "unexpected": 1}),
            (f"{field} nested nulls", {**raw, field: [[None]]}),
            (f"{field} a huge number", {**raw, field: 10 ** 400 if not isinstance(raw[field], int) else "x"})]


def test_field_mutations_of_every_record_kind_are_named_and_never_exit_1(base, tmp_path, cli, record_fault):
    """The store-record fuzz at field level: each kind's record, parsed, one field mutated in a way
    its schema refuses, written back; gc, scrub, ls, history and rollout status never exit 1, gc
    removes nothing prod uses, and scrub names the record."""
    root, draft, a, b = base
    rng = random.Random(290)
    runs = 0
    for kind in KINDS:
        for _ in range(scale(1)):
            probe = open_store(f"file://{root}/store")
            raw = json.loads(probe.get_bytes(record_of(probe, kind, draft, a, b)))
            for what, mutated in mutations(raw, rng):
                d = tmp_path / f"{kind.replace(' ', '-')}-{runs}"
                shutil.copytree(root / "store", d)
                store = open_store(f"file://{d}")
                key = record_of(store, kind, draft, a, b)
                overwrite(store, key, json.dumps(mutated).encode())
                for args in COMMANDS:
                    code, out, err = cli("--store", d, *args)
                    runs += 1
                    assert code in (0, 3, 10) and "Traceback" not in err, (kind, what, args, code, err[-500:])
                    if args[1] == "gc":
                        assert a not in json.loads(out)["removed_artifacts"], (kind, what)
                code, skipped, err = scrub_skipped(cli, d)
                runs += 1
                assert code == 10 and key in skipped, (kind, what, key, code, skipped, err[-300:])
    record_fault("field mutations of each record kind", f"{len(KINDS)} kinds, a field of one record mutated "
                 "(unknown field, wrong type, out-of-range number); five store-wide commands never exit 1 and "
                 "scrub names the record", runs)
