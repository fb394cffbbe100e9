"""The promotion gate's edges, each alone and fast: where a passing artifact goes next, an
attestation that says pass against its own figures, one that did not pass, a rehashed manifest
whose predecessor is gone or holds other files, and a rollback that must be told which compat key."""

from __future__ import annotations

import pytest

from buildctl.artifact_store.read import get_manifest
from buildctl.artifact_store.trust.attestations import Attestation, write_attestation as write_att
from buildctl.artifact_store.trust.authority import Authority
from buildctl.artifact_store.channels import ChannelMove, set_channel
from buildctl.artifact_store.errors import StoreArgumentError
from buildctl.artifact_store.promotion import next_channel, promotion_refusals, rollback

from ..support.helpers import attestation, publish_files


def test_a_passing_artifact_goes_to_staging_then_prod_then_nowhere():
    assert [next_channel(c) for c in (None, "staging", "prod", "canary")] == ["staging", "prod", None, None]


def _one(store, tmp_path, draft, name="a", verdict="pass"):
    return publish_files(store, tmp_path / name, draft, {"config.json": name.encode(), "w.bin": 1000}, seed=len(name),
                         verdict=verdict)


def test_an_attestation_whose_figures_do_not_give_its_pass_is_refused(store, tmp_path, draft):
    aid = _one(store, tmp_path, draft, verdict=None)
    data = attestation(aid, draft.compat_key, "pass").model_dump(mode="json")
    data["parity"]["per_prompt"] = []  # the verdict field says pass; the figures cannot
    write_att(store, Attestation.model_validate(data))
    (why,) = promotion_refusals(store, aid, get_manifest(store, aid), Authority())
    assert "says pass but its recorded figures give fail" in why and "per-prompt records" in why


def test_a_failed_attestation_is_refused_with_its_verdict(store, tmp_path, draft):
    aid = _one(store, tmp_path, draft, verdict="fail")
    (why,) = promotion_refusals(store, aid, get_manifest(store, aid), Authority())
    assert "did not pass: verdict 'fail'" in why
    ok = _one(store, tmp_path, draft, name="ok")
    assert promotion_refusals(store, ok, get_manifest(store, ok), Authority()) == []
    bare = _one(store, tmp_path, draft, name="bare", verdict=None)
    assert promotion_refusals(store, bare, get_manifest(store, bare), Authority(), compat_key="other-key") == [
        "no validation attestation for compat key other-key"]


def test_a_rehashed_manifest_borrows_only_its_predecessors_attestation_for_the_same_files(store, tmp_path, draft,
                                                                                           monkeypatch):
    old = _one(store, tmp_path, draft, name="old")
    new = _one(store, tmp_path, draft, name="new", verdict=None)
    m = get_manifest(store, new)
    same = m.model_copy(update={"rehashed_from": old})
    assert promotion_refusals(store, new, same, Authority())[0].startswith("no validation attestation")  # other files
    monkeypatch.setattr(type(m), "same_files", lambda self, other: True)
    assert promotion_refusals(store, new, same, Authority()) == []  # the same files: the old attestation counts
    gone = m.model_copy(update={"rehashed_from": "xxh3-128:" + "9" * 32})
    assert promotion_refusals(store, new, gone, Authority())[0].startswith("no validation attestation")


def test_a_rollback_on_a_channel_with_several_compat_keys_needs_one_named(store, tmp_path, draft):
    a, b = _one(store, tmp_path, draft, name="a"), _one(store, tmp_path, draft, name="b")
    for aid, key in ((a, draft.compat_key), (b, "trtllm-" + "1" * 32)):
        set_channel(store, aid, get_manifest(store, aid), "staging", move=ChannelMove(compat_key=key))
    with pytest.raises(StoreArgumentError, match="has refs for 2 compat keys; pass --compat-key"):
        rollback(store, draft.profile_name, "staging")


def test_an_attestation_under_the_key_it_is_promoted_under_counts(store, tmp_path, draft):
    """Promoted under another compat key (a schema-1 key's refs), the attestation under that key is
    the one that counts, not only the manifest's."""
    aid = _one(store, tmp_path, draft, verdict=None)
    write_att(store, attestation(aid, "other-key", "pass"))
    m = get_manifest(store, aid)
    assert promotion_refusals(store, aid, m, Authority(), compat_key="other-key") == []
    assert promotion_refusals(store, aid, m, Authority())[0].startswith("no validation attestation")


def test_prod_takes_only_the_artifact_that_was_on_staging_under_either_key(store, tmp_path, draft):
    """staging → prod: another artifact on staging is no proof for this one; a staging record under
    the key the artifact is promoted under is."""
    from buildctl.artifact_store.promotion import staging_refusal

    x, y = _one(store, tmp_path, draft, name="x"), _one(store, tmp_path, draft, name="y")
    mx = get_manifest(store, x)
    set_channel(store, y, get_manifest(store, y), "staging")
    assert "it was never on 'staging'" in staging_refusal(store, x, mx, "prod")
    other = "aoti-" + "7" * 32
    set_channel(store, x, mx, "staging", move=ChannelMove(compat_key=other))
    assert staging_refusal(store, x, mx, "prod", compat_key=other) is None
    assert "it was never on 'staging'" in staging_refusal(store, x, mx, "prod")  # not under its own key


def test_promote_re_hashes_by_default_even_right_after_a_deep_verify(store, tmp_path, draft):
    """The library's default trusts no earlier verify: a byte flipped a moment after one is caught."""
    from buildctl.artifact_store.errors import VerificationError
    from buildctl.artifact_store.upkeep.integrity import verify_deep_or_quarantine
    from buildctl.artifact_store.promotion import promote

    from ..support.helpers import rot

    aid = _one(store, tmp_path, draft)
    verify_deep_or_quarantine(store, aid, detector="validation")
    rot(store, next(f.digest for f in get_manifest(store, aid).files if f.path == "w.bin"), "flip")
    with pytest.raises(VerificationError):
        promote(store, aid, "staging")
