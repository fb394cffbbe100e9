"""``buildctl.artifact_store``: the immutable, content-addressed artifact store.

One small key/bytes interface (:mod:`.backend`) with two backends (:mod:`.local`, :mod:`.s3`,
the only boto3 importer), and the operations on top, one module per concern:

* :mod:`.layout`: every key name;
* :mod:`.manifest`: manifests, path rules, tree scanning and hashing;
* :mod:`.publish`: publish a tree, the build-key index;
* :mod:`.verify`: read with verification, resolve ids, list, verify (``deep``: every byte);
* :mod:`.signing`: Ed25519 keys and signatures;
* :mod:`.attestations`: the typed validation record;
* :mod:`.authority`: who acts and with which keys (one value per command);
* :mod:`.channels`: channel refs, compare-and-swap moves, history, k-of-n co-signing, re-signing;
* :mod:`.promotion`: the promotion gate, promotion and rollback;
* :mod:`.rollout`: rollout records, wave buckets, which artifact a node gets (the steps that move
  a rollout on are in :mod:`buildctl.rollouts`);
* :mod:`.integrity`: deep verify at the gates, quarantining on a mismatch; :mod:`.quarantine`,
  :mod:`.repair`;
* :mod:`.gc`: garbage collection;
* :mod:`.pull`: install a channel's artifact on a node, from :mod:`.trust` (may the node trust the
  record), :mod:`.download` (bytes verified as they arrive) and :mod:`.install_dir` (the node's
  directory); :mod:`.checkpoints`: download model checkpoints.

The names below are re-exported for callers that want the whole API in one import.
"""

from buildctl.artifact_store.attestations import (
    Attestation,
    StoredAttestation,
    latest_attestation,
    list_attestations,
    write_attestation,
)
from buildctl.artifact_store.backend import ProgressFn, Store, open_store
from buildctl.artifact_store.authority import Authority
from buildctl.artifact_store.channels import ChannelRecord, channels_pointing_at, history, read_channel, set_channel
from buildctl.artifact_store.promotion import promote, rollback
from buildctl.artifact_store.gc import GcResult, gc
from buildctl.artifact_store.layout import manifest_signature_prefix
from buildctl.artifact_store.manifest import Manifest
from buildctl.times import utc_now
from buildctl.artifact_store.publish import ManifestDraft, PublishResult, lookup_build_key, publish_tree
from buildctl.artifact_store.verify import get_manifest, list_artifacts, resolve_artifact, verify

__all__ = [
    "Attestation", "Authority", "ChannelRecord", "GcResult", "Manifest", "ManifestDraft", "ProgressFn", "PublishResult",
    "Store", "StoredAttestation", "channels_pointing_at", "gc", "get_manifest", "history", "latest_attestation",
    "list_artifacts", "list_attestations", "lookup_build_key", "manifest_signature_prefix", "open_store",
    "promote", "publish_tree", "read_channel", "resolve_artifact", "rollback", "set_channel", "utc_now", "verify",
    "write_attestation",
]
