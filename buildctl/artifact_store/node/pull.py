"""Pull: resolve a channel for this host, check that the node may trust the record, install its
artifact. The pieces are :mod:`~buildctl.artifact_store.node.admission` (may the node trust it),
:mod:`~buildctl.artifact_store.node.download` (bytes verified as they arrive) and
:mod:`~buildctl.artifact_store.node.install_dir` (the node's directory, swapped atomically).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from buildctl.artifact_store.backends.store import ProgressFn, Store
from buildctl.artifact_store.channels import ChannelRecord, read_channel
from buildctl.artifact_store.errors import ChannelNotFoundError, StoreNotFoundError
from buildctl.artifact_store.layout import CHANNELS
from buildctl.artifact_store.node.install_dir import (
    Preflight,
    PullResult,
    channel_ref,
    current_artifact,
    InstallOptions,
    install_artifact,
    installed_seqs,
    record_verified,
    verified_refs,
)
from buildctl.artifact_store.node.admission import check_fresh, check_trust
from buildctl.artifact_store.trust.authority import Authority
from buildctl.core.records import Record

HEALTH_TIMEOUT_S = 600.0


class PullOptions(Record):
    """How a node pulls: ``buildctl pull``'s flags as one frozen record. The store's pull reads
    ``node_id``, ``keep`` and ``min_seq``; the node agent (:func:`buildctl.steps.node_agent.pull`)
    the smoke check's and coverage's. Who may be trusted, and whether BLAKE3 is required, are the
    :class:`~buildctl.artifact_store.trust.authority.Authority`'s."""

    node_id: str | None = Field(None, description="this node's id: picks its side of a rollout, and its record gets the verdict")
    keep: int = Field(2, description="installed versions to keep (current and previous at least)")
    min_seq: int = Field(0, ge=0, description="refuse a channel record older than this sequence")
    skip_preflight: bool = Field(False, description="install after byte verification only, without a test load")
    health_check: bool = Field(True, description="smoke-check a newly installed engine, switching back if it fails")
    health_cmd: str | None = Field(None, description="the smoke check's command (default: load and generate)")
    health_timeout_s: float = Field(HEALTH_TIMEOUT_S, gt=0, description="how long the smoke check may run")
    retry_failed: bool = Field(False, description="install again an artifact that failed its smoke check here")
    require_covered: bool = Field(False, description="refuse an engine not validated on this host's soft values")


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


def pull(store: Store, record: ChannelRecord, dest: str | Path, *, auth: Authority = Authority(),
         options: PullOptions = PullOptions(), preflight: Preflight | None = None,
         on_bytes: ProgressFn | None = None) -> PullResult:
    """Install the artifact of ``record`` (:func:`resolve_channel`: the channel's record for this
    host's compat keys) for ``options.node_id``. With the authority's ``trusted`` keys (the CLI
    loads them from ``BUILDCTL_TRUSTED_KEYS``), signatures and rollback protection are enforced,
    and a ref older than the newest signed history record is refused; a record below
    ``options.min_seq`` and an expired record are refused always. During a rollout the record
    gives the node the new artifact or the old one by its wave bucket (no id: the old one). The
    manifest bytes must hash to the BLAKE3 the record signs, when it carries one; the authority's
    ``require_crypto`` refuses a record that carries none and a manifest without per-file BLAKE3."""
    dest = Path(dest)
    check_fresh(record, options.min_seq)
    artifact_id = record.artifact_for(options.node_id)
    proof = None
    if auth.trusted is not None:
        ref = channel_ref(record)
        proof = check_trust(store, record, auth.trusted, seen=installed_seqs(dest).get(ref, 0), artifact_id=artifact_id,
                            known=verified_refs(dest).get(ref) if current_artifact(dest) == artifact_id else None)
    install = InstallOptions(keep=options.keep, bound=record.bound(artifact_id), require_crypto=auth.require_crypto)
    result = install_artifact(store, artifact_id, dest, options=install, preflight=preflight, on_bytes=on_bytes,
                              record=record)
    result.record = record
    if proof is not None:
        try:
            record_verified(dest, proof)
        except OSError:
            pass  # a proof not kept costs the next pull a full trust check, nothing else
    return result
