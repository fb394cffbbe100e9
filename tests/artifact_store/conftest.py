"""Fixtures of the node-side store tests (install directory, trust): a local store with four
small signed-or-not artifacts and a deep install directory."""

from __future__ import annotations

import os

import pytest

from buildctl.artifact_store.publish import publish_tree
from buildctl.artifact_store.backends.store import open_store
from buildctl.artifact_store.trust.signing import TrustedKeys, sign_manifest

from ..support.helpers import make_signer, make_tree, write_attestation


@pytest.fixture
def node_env(tmp_path, draft):
    store = open_store(f"file://{tmp_path / 'store'}")
    ids = []
    for i in range(4):
        root = make_tree(tmp_path / f"t{i}", {"config.json": f"{i}".encode(), "run.sh": b"#!/bin/sh\n",
                                             "rank0.engine": 20_000 + i, "tok/a/vocab.json": b"{}",
                                             "tok/a/merges.txt": b"a b"}, seed=i)
        os.chmod(root / "run.sh", 0o755)
        aid = publish_tree(store, root, draft).artifact_id
        write_attestation(store, aid, draft.compat_key, "pass")
        ids.append(aid)
    return store, ids, tmp_path / "deep" / "er" / "node", draft


@pytest.fixture
def signed_env(node_env):
    store, ids, dest, draft = node_env
    builder, p1, p2 = make_signer(), make_signer(), make_signer()
    for aid in ids:
        sign_manifest(store, aid, builder)
    trusted = TrustedKeys({"builder": {builder.key_id: builder.private.public_key()},
                           "promoter": {k.key_id: k.private.public_key() for k in (p1, p2)}})
    return store, ids, dest, trusted, p1, p2
