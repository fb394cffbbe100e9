"""buildctl.artifact_store.promotion: the gates re-hash every blob unless told to trust an earlier
deep verify (#29 item 2), on both stores."""

from __future__ import annotations

import pytest

from buildctl.artifact_store.promotion import promote
from buildctl.artifact_store.read import get_manifest
from buildctl.artifact_store.channels import history, read_channel
from buildctl.artifact_store.errors import VerificationError
from buildctl.artifact_store.upkeep.integrity import verify_deep_or_quarantine
from buildctl.artifact_store.promotion import rollback
from buildctl.artifact_store.quarantine import active_quarantine

from ..support.helpers import publish_files, rot, staged, write_build_provenance


def _published(store, tmp_path, draft, name: str, seed: int) -> str:
    return publish_files(store, tmp_path / name, draft, {"config.json": name.encode(), "rank0.engine": 300_000},
                         seed=seed)


def _engine_blob(store, aid: str) -> str:
    return next(f.digest for f in get_manifest(store, aid).files if f.path == "rank0.engine")


def test_a_byte_flipped_after_a_deep_verify_is_caught_by_promote(store, tmp_path, draft, cli):
    """A validation's deep verify is on record; one byte of the engine flips; promote to prod
    re-hashes by default, refuses (exit 4) and quarantines."""
    aid = _published(store, tmp_path, draft, "v1", 1)
    verify_deep_or_quarantine(store, aid, detector="validation")  # what validation records
    rot(store, _engine_blob(store, aid), "flip")
    staged(store, aid)
    code, _, err = cli("--store", store.uri, "promote", aid, "--channel", "prod")
    assert code == 4, err
    assert read_channel(store, draft.profile_name, "prod", draft.compat_key) is None
    assert active_quarantine(store, aid) is not None


def test_trusting_an_earlier_verify_is_an_explicit_opt_in_and_is_recorded(store, tmp_path, draft, cli):
    aid = _published(store, tmp_path, draft, "v1", 1)
    verify_deep_or_quarantine(store, aid, detector="validation")
    staged(store, aid)
    code, out, err = cli("--store", store.uri, "--json", "promote", aid, "--channel", "prod",
                         "--trust-verify-within", "1h")
    assert code == 0, err
    rec = read_channel(store, draft.profile_name, "prod", draft.compat_key)[0]
    assert rec.verify_window_s == 3600.0
    code, out, _ = cli("--store", store.uri, "history", "--profile", draft.profile_name, "--channel", "prod")
    assert "trusted a verify within 1h" in out
    v2 = _published(store, tmp_path, draft, "v2", 2)
    staged(store, v2)
    code, _, err = cli("--store", store.uri, "--json", "promote", v2, "--channel", "prod")
    assert code == 0, err
    rec = read_channel(store, draft.profile_name, "prod", draft.compat_key)[0]
    assert rec.verify_window_s == 0.0  # re-hashed at the gate
    code, out, _ = cli("--store", store.uri, "history", "--profile", draft.profile_name, "--channel", "prod")
    assert "re-hashed at the gate" in out


def test_rollback_re_hashes_its_target(store, tmp_path, draft):
    v1, v2 = _published(store, tmp_path, draft, "v1", 1), _published(store, tmp_path, draft, "v2", 2)
    promote(store, staged(store, v1), "prod")
    promote(store, staged(store, v2), "prod")
    rot(store, _engine_blob(store, v1), "flip")  # v1 verified deep at its promotion, minutes ago
    with pytest.raises(VerificationError):
        rollback(store, draft.profile_name, "prod")
    assert read_channel(store, draft.profile_name, "prod", draft.compat_key)[0].artifact_id == v2
    assert [r.artifact_id for r in history(store, draft.profile_name, "prod", draft.compat_key)] == [v1, v2]


# --- refuse before writing what nodes will refuse (#29 item 5) ---------------------------------


def _trusted(store, tmp_path, draft):
    from buildctl.artifact_store.trust.authority import Authority
    from buildctl.artifact_store.trust.signing import TrustedKeys

    from ..support.helpers import make_signer

    builder, promoter, validator, stranger = make_signer(), make_signer(), make_signer(), make_signer()
    trusted = TrustedKeys({"builder": {builder.key_id: builder.private.public_key()},
                           "promoter": {promoter.key_id: promoter.private.public_key()},
                           "validator": {validator.key_id: validator.private.public_key()}})
    aid = _published(store, tmp_path, draft, "v1", 1)
    return aid, trusted, {"promoter": promoter, "validator": validator, "stranger": stranger, "builder": builder}, Authority


@pytest.mark.parametrize("who", ["validator", "builder", "stranger"])
def test_a_channel_move_signed_by_a_key_nodes_will_not_trust_is_refused_before_it_is_written(store, tmp_path, draft,
                                                                                              who):
    from buildctl.artifact_store.channels import set_channel
    from buildctl.core.errors import GateRefusedError

    aid, trusted, keys, Authority = _trusted(store, tmp_path, draft)
    with pytest.raises(GateRefusedError, match="promoter"):
        set_channel(store, aid, get_manifest(store, aid), "prod", auth=Authority(signer=keys[who], trusted=trusted))
    assert read_channel(store, draft.profile_name, "prod", draft.compat_key) is None
    rec = set_channel(store, aid, get_manifest(store, aid), "prod",
                      auth=Authority(signer=keys["promoter"], trusted=trusted))
    assert rec.seq == 1


def test_a_revoked_promoter_key_is_refused_before_writing(store, tmp_path, draft):
    from datetime import datetime, timezone

    from buildctl.artifact_store.channels import set_channel
    from buildctl.artifact_store.trust.signing import TrustedKeys
    from buildctl.core.errors import GateRefusedError

    aid, trusted, keys, Authority = _trusted(store, tmp_path, draft)
    revoked = TrustedKeys(trusted.by_role, revoked={keys["promoter"].key_id: (datetime(2020, 1, 1, tzinfo=timezone.utc),
                                                                              "lost laptop")})
    with pytest.raises(GateRefusedError, match="revoked"):
        set_channel(store, aid, get_manifest(store, aid), "prod",
                    auth=Authority(signer=keys["promoter"], trusted=revoked))
    assert read_channel(store, draft.profile_name, "prod", draft.compat_key) is None


def test_prod_requires_staging_first_unless_forced_with_a_reason(store, tmp_path, draft, cli):
    """#29 8b: an artifact that was never on staging is refused by prod (exit 5, saying so);
    ``--force --reason`` overrides it and the record says it was forced and why."""
    aid = _published(store, tmp_path, draft, "v1", 1)
    code, _, err = cli("--store", store.uri, "promote", aid, "--channel", "prod")
    assert code == 5 and "never on 'staging'" in err, err
    assert read_channel(store, draft.profile_name, "prod", draft.compat_key) is None
    code, _, err = cli("--store", store.uri, "promote", aid, "--channel", "prod", "--force", "--reason", "hotfix INC-7")
    assert code == 0, err
    rec = read_channel(store, draft.profile_name, "prod", draft.compat_key)[0]
    assert rec.forced and rec.reason == "hotfix INC-7"
    v2 = _published(store, tmp_path, draft, "v2", 2)
    write_build_provenance(store, v2)
    assert cli("--store", store.uri, "promote", v2, "--channel", "staging")[0] == 0
    code, _, err = cli("--store", store.uri, "promote", v2, "--channel", "prod")
    assert code == 0, err
    assert not read_channel(store, draft.profile_name, "prod", draft.compat_key)[0].forced
