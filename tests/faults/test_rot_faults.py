"""Rot in place: bytes changed with the size kept, truncation, a missing blob, at random blobs and
offsets, on both stores. Each case measures time to recovery: from the corruption to the channel
on an artifact that deep-verifies, in pipeline runs (one ``heal``) and seconds."""

from __future__ import annotations

import random
import statistics
import time

import pytest

import buildctl.artifact_store as ops
from buildctl.healing import heal_artifact
from buildctl.artifact_store.errors import QuarantinedError
from buildctl.artifact_store.integrity import verify_deep_or_quarantine
from buildctl.artifact_store.install_dir import install_artifact
from buildctl.artifact_store.quarantine import active_quarantine
from buildctl.artifact_store.authority import Authority
from buildctl.context import Context

from ..support.helpers import make_tree, rot, settings, write_attestation, staged
from .conftest import scale


@pytest.mark.parametrize("kind", ["flip", "truncate", "missing"])
def test_rot_in_place_is_detected_quarantined_and_recovered(store, draft, tmp_path, kind, record_fault):
    rng = random.Random(f"{kind}-{store.uri}")
    st = settings()
    seconds, wrong_installs = [], 0
    n = scale(3)
    for i in range(n):
        sizes = {"rank0.engine": rng.randrange(10_000, 300_000), "rank1.engine": rng.randrange(1, 50_000)}
        # no blob shared between the two (a shared blob that rots takes both down, as it should)
        good = ops.publish_tree(store, make_tree(tmp_path / f"g{i}", {"config.json": f'{{"case": {i}, "v": 1}}'.encode(),
                                                                      **sizes}, seed=2 * i), draft).artifact_id
        bad = ops.publish_tree(store, make_tree(tmp_path / f"b{i}", {"config.json": f'{{"case": {i}, "v": 2}}'.encode(),
                                                                     **sizes}, seed=2 * i + 1), draft).artifact_id
        for a in (good, bad):
            write_attestation(store, a, draft.compat_key)
            ops.promote(store, staged(store, a), "prod", auth=Authority(verify_window_s=0))
        victim = rng.choice([f for f in ops.get_manifest(store, bad).files])
        rot(store, victim.digest, kind, rng)
        t0 = time.monotonic()
        rep = heal_artifact(Context.from_settings(st, store=store), bad)  # one pipeline run
        seconds.append(time.monotonic() - t0)
        assert not rep.store_copy_ok and victim.path in " ".join(rep.problems)
        assert active_quarantine(store, bad) is not None
        rec = ops.read_channel(store, draft.profile_name, "prod", draft.compat_key)[0]
        assert rec.artifact_id == good and rec.action == "rollback" and bad in rec.reason
        verify_deep_or_quarantine(store, rec.artifact_id, detector="test", auth=Authority(who="test"))  # the channel is on verified bytes
        with pytest.raises(QuarantinedError):
            install_artifact(store, bad, tmp_path / f"node{i}")  # never installed
        wrong_installs += (tmp_path / f"node{i}" / "current").exists()
    record_fault(f"rot in place: {kind} ({'S3' if store.uri.startswith('s3') else 'local'})",
                 {"flip": "one random bit of a random blob flipped in place, size kept",
                  "truncate": "a random blob cut at a random offset", "missing": "a random blob deleted"}[kind],
                 n, bad_installs=wrong_installs,
                 outcome=f"ok (quarantined, channel rolled back in 1 pipeline run; median "
                         f"{statistics.median(seconds):.2f}s, max {max(seconds):.2f}s)")
