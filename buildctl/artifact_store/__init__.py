"""``buildctl.artifact_store``: the immutable, content-addressed artifact store.

Rooms (sub-packages), each with its own index, and the store-wide modules beside them. Floors,
top to bottom (import-linter keeps them, and no module imports one above its floor):

* :mod:`.gc` (garbage collection), :mod:`.promotion` (the gate, promotion and rollback),
  :mod:`.records` (every kind of small record, and one check that reads them all);
* :mod:`.publish`: checksum a tree into one immutable artifact, and the build-key index;
* :mod:`.upkeep`: deep checks at the gates, repair, rehash;
* :mod:`.node`: pull, admission, download, the install directory, checkpoints;
* :mod:`.channels`: channel refs, compare-and-swap moves, history, k-of-n co-signing, re-signing;
* :mod:`.fleet` (inventory, rollout waves) and :mod:`.quarantine`;
* :mod:`.trust`: signing keys, authority, revocation, binding, attestations, provenance;
* :mod:`.read` (reading with verification, id resolution, listing, ``verify``) and :mod:`.grace`
  (how publish and gc share blobs without a lock);
* :mod:`.backends`: the key/bytes interface, local and S3, ranged reads, listings, the manifest memo;
* :mod:`.manifest`, then :mod:`.layout` (every key name) and :mod:`.errors`.

The names below are re-exported for callers that want the whole API in one import.
"""

from buildctl.artifact_store.trust.attestations import (
    Attestation,
    StoredAttestation,
    latest_attestation,
    list_attestations,
    write_attestation,
)
from buildctl.artifact_store.backends.store import ProgressFn, Store, open_store
from buildctl.artifact_store.trust.authority import Authority
from buildctl.artifact_store.channels import ChannelRecord, channels_pointing_at, history, read_channel, set_channel
from buildctl.artifact_store.promotion import promote, rollback
from buildctl.artifact_store.gc import GcResult, gc
from buildctl.artifact_store.layout import manifest_signature_prefix
from buildctl.artifact_store.manifest import Manifest
from buildctl.core.times import utc_now
from buildctl.artifact_store.publish import ManifestDraft, PublishResult, lookup_build_key, publish_tree
from buildctl.artifact_store.read import get_manifest, list_artifacts, resolve_artifact, verify

__all__ = [
    "Attestation", "Authority", "ChannelRecord", "GcResult", "Manifest", "ManifestDraft", "ProgressFn", "PublishResult",
    "Store", "StoredAttestation", "channels_pointing_at", "gc", "get_manifest", "history", "latest_attestation",
    "list_artifacts", "list_attestations", "lookup_build_key", "manifest_signature_prefix", "open_store",
    "promote", "publish_tree", "read_channel", "resolve_artifact", "rollback", "set_channel", "utc_now", "verify",
    "write_attestation",
]
