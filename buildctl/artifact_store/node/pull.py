"""Pull: resolve a channel for this host, check that the node may trust the record, install its
artifact. The pieces are :mod:`~buildctl.artifact_store.node.admission` (may the node trust it),
:mod:`~buildctl.artifact_store.node.download` (bytes verified as they arrive) and
:mod:`~buildctl.artifact_store.node.install_dir` (the node's directory, swapped atomically).
"""

from __future__ import annotations

from pathlib import Path

from buildctl.artifact_store.backends.store import ProgressFn, Store
from buildctl.artifact_store.channels import ChannelRecord, read_channel
from buildctl.artifact_store.errors import ChannelNotFoundError, StoreNotFoundError
from buildctl.artifact_store.layout import CHANNELS
from buildctl.artifact_store.node.install_dir import (
    Preflight,
    PullResult,
    channel_ref,
    current_artifact,
    install_artifact,
    installed_seqs,
    record_verified,
    verified_refs,
)
from buildctl.artifact_store.trust.signing import TrustedKeys
from buildctl.artifact_store.node.admission import check_fresh, check_trust


def resolve_channel(store: Store, profile: str, channel: str, compat_keys: list[str]) -> ChannelRecord:
    """The channel record for the first compat key that has one. A miss says which name is wrong
    (:func:`unknown_name`): the store, the profile, the channel, or else this host's keys."""
    for key in compat_keys:
        got = read_channel(store, profile, channel, key)
        if got is not None:
            return got[0]
    raise ChannelNotFoundError(profile, channel, compat_keys, unknown_name(store, profile, channel))


def unknown_name(store: Store, profile: str, channel: str) -> str | None:
    """Why ``profile``'s ``channel`` has no ref at all, naming the wrong name and the known ones;
    None when the channel exists and only this host's compat keys are missing from it. An empty
    store, or one that does not exist, is :class:`StoreNotFoundError`."""
    mine = {k[len(CHANNELS) + len(profile) + 1:].split("/", 1)[0] for k in store.list(f"{CHANNELS}{profile}/")}
    if channel in mine:
        return None
    if mine:
        return (f"profile {profile!r} has no channel {channel!r} in store {store.uri}; "
                f"its channels: {', '.join(sorted(mine))}")
    profiles = sorted({k[len(CHANNELS):].split("/", 1)[0] for k in store.list(CHANNELS)})
    if not profiles and next(iter(store.list("")), None) is None:
        raise StoreNotFoundError(store.uri)
    return (f"profile {profile!r} has no channel in store {store.uri}; "
            + (f"profiles with channels: {', '.join(profiles)}" if profiles else "no profile has a channel there yet"))


def pull(
    store: Store,
    profile: str,
    channel: str,
    dest: str | Path,
    compat_keys: list[str],
    *,
    preflight: Preflight | None = None,
    keep: int = 2,
    on_bytes: ProgressFn | None = None,
    trusted: TrustedKeys | None = None,
    min_seq: int = 0,
    node_id: str | None = None,
    record: ChannelRecord | None = None,
    require_crypto: bool = False,
) -> PullResult:
    """Resolve the channel for this host's compat keys and install its artifact. With ``trusted``
    keys (the CLI loads them from ``BUILDCTL_TRUSTED_KEYS``), signatures and rollback protection
    are enforced, and a ref older than the newest signed history record is refused; a record
    below ``min_seq`` and an expired record are refused always. During a rollout the record gives
    ``node_id`` the new artifact or the old one by its wave bucket (no id: the old one).
    ``record``: the one already resolved (its refusals are still checked here). The manifest bytes
    must hash to the BLAKE3 the record signs, when it carries one; ``require_crypto`` refuses a
    record that carries none and a manifest without per-file BLAKE3."""
    record = record or resolve_channel(store, profile, channel, compat_keys)
    dest = Path(dest)
    check_fresh(record, min_seq)
    artifact_id = record.artifact_for(node_id)
    proof = None
    if trusted is not None:
        ref = channel_ref(record)
        proof = check_trust(store, record, trusted, seen=installed_seqs(dest).get(ref, 0), artifact_id=artifact_id,
                            known=verified_refs(dest).get(ref) if current_artifact(dest) == artifact_id else None)
    result = install_artifact(store, artifact_id, dest, preflight=preflight, keep=keep, on_bytes=on_bytes,
                              bound=record.bound(artifact_id), require_crypto=require_crypto, record=record)
    result.record = record
    if proof is not None:
        try:
            record_verified(dest, proof)
        except OSError:
            pass  # a proof not kept costs the next pull a full trust check, nothing else
    return result
