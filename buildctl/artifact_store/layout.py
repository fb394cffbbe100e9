"""Every key the store uses, named in one place (docs/store-layout.md describes them).

No other module builds a key string: they call these functions.
"""

from __future__ import annotations

import xxhash

from buildctl.core.digest import hex_of

BLOBS = "blobs/"
MANIFESTS = "manifests/"
CHANNELS = "channels/"
HISTORY = "history/"
NODES = "inventory/nodes/"
TOUCHES = "touches/blobs/"
REVOCATIONS = "keys/revocations/"
ATTESTATIONS = "attestations/"
QUARANTINE = "quarantine/"
VERIFICATIONS = "verifications/"
PENDING = "pending/"


def blob_key(digest: str) -> str:
    h = hex_of(digest)
    return f"{BLOBS}{h[:2]}/{h}"


def manifest_key(artifact_id: str) -> str:
    return f"{MANIFESTS}{hex_of(artifact_id)}.json"


def manifest_prefix(hex_prefix: str) -> str:
    """Manifests whose artifact hex starts with ``hex_prefix`` (for id prefixes)."""
    return f"{MANIFESTS}{hex_prefix}"


def artifact_of_manifest_key(key: str) -> str:
    """The artifact id a ``manifests/<hex>.json`` key names."""
    return "xxh3-128:" + key[len(MANIFESTS):-len(".json")]


IDENTITY_INDEX = "index/identity/"


def identity_key(identity: str) -> str:
    """A byte-identical copy of the manifest of the artifact with this identity."""
    return f"{IDENTITY_INDEX}{hex_of(identity)}.json"


def build_index_key(build_key: str, generation: int = 0) -> str:
    """The build-key record; a later generation is claimed when the earlier owner is quarantined."""
    suffix = f".{generation}" if generation else ""
    return f"index/build-keys/{hex_of(build_key)}{suffix}.json"


def build_index_prefix(build_key: str) -> str:
    """Every generation of one build key's record."""
    return f"index/build-keys/{hex_of(build_key)}"


PAIR_INDEX = "index/pairs/"


def pair_prefix(profile: str, profile_hash: str) -> str:
    """Artifacts built from this profile's build hash (one empty marker each, written at publish
    before the manifest): the reconcile plan lists its profiles' current hashes only."""
    return f"{PAIR_INDEX}{profile}/{profile_hash.split(':', 1)[-1]}/"


def pair_key(profile: str, profile_hash: str, artifact_id: str) -> str:
    return f"{pair_prefix(profile, profile_hash)}{hex_of(artifact_id)}"


def artifact_of_pair_key(key: str) -> str:
    return "xxh3-128:" + key.rsplit("/", 1)[1]


REHASH_INDEX = "index/rehashed/"


def rehash_prefix(artifact_id: str) -> str:
    """The rehashed successors of a schema 1 artifact (one empty marker each, written by
    ``buildctl rehash`` before the new manifest): ``show`` names them."""
    return f"{REHASH_INDEX}{hex_of(artifact_id)}/"


def rehash_key(old: str, new: str) -> str:
    return f"{rehash_prefix(old)}{hex_of(new)}"


def timed_record_names_its_bytes(key: str, record_id: str) -> bool:
    """Whether a create-only record's key (:func:`_timed_record_key`) carries this digest of its bytes."""
    return key.endswith(f"-{hex_of(record_id)}.json")


def _timed_record_key(prefix: str, when: str, record_id: str) -> str:
    """``<prefix><UTC time>-<record hex>.json``: records of one artifact list oldest first, and each
    name carries the digest of its bytes."""
    return f"{prefix}{when}-{hex_of(record_id)}.json"


def attestation_prefix(artifact_id: str) -> str:
    return f"{ATTESTATIONS}{hex_of(artifact_id)}/"


def attestation_key(artifact_id: str, created_at: str, attestation_id: str) -> str:
    return _timed_record_key(attestation_prefix(artifact_id), created_at, attestation_id)


def quarantine_prefix(artifact_id: str) -> str:
    return f"{QUARANTINE}{hex_of(artifact_id)}/"


def quarantine_key(artifact_id: str, when: str, record_id: str) -> str:
    return _timed_record_key(quarantine_prefix(artifact_id), when, record_id)


def verification_prefix(artifact_id: str) -> str:
    return f"{VERIFICATIONS}{hex_of(artifact_id)}/"


def verification_key(artifact_id: str, when: str, record_id: str) -> str:
    return _timed_record_key(verification_prefix(artifact_id), when, record_id)


def provenance_key(artifact_id: str) -> str:
    """The artifact's build provenance (a DSSE envelope; create-only), beside its manifest."""
    return f"provenance/{hex_of(artifact_id)}.json"


def manifest_signature_prefix(artifact_id: str) -> str:
    return f"signatures/manifests/{hex_of(artifact_id)}/"


def manifest_signature_key(artifact_id: str, key_id: str) -> str:
    return f"{manifest_signature_prefix(artifact_id)}{key_id}.json"


def channel_prefix(profile: str, channel: str) -> str:
    return f"{CHANNELS}{profile}/{channel}/"


def channel_key(profile: str, channel: str, compat_key: str) -> str:
    return f"{channel_prefix(profile, channel)}{compat_key}.json"


def compat_key_of_channel_key(key: str) -> str:
    return key.rsplit("/", 1)[1][:-len(".json")]


def history_channel_prefix(profile: str, channel: str) -> str:
    return f"{HISTORY}{profile}/{channel}/"


def history_prefix(profile: str, channel: str, compat_key: str) -> str:
    return f"{history_channel_prefix(profile, channel)}{compat_key}/"


def history_key(profile: str, channel: str, compat_key: str, seq: int) -> str:
    return f"{history_prefix(profile, channel, compat_key)}{seq:012d}.json"


COMPACTED_INDEX = "index/history-compacted/"


def compacted_key(history_ref: str, seq: int) -> str:
    """gc's mark that the history records of ``history_ref`` (``history/<p>/<c>/<k>``) up to
    ``seq`` were examined for compaction (an empty object; only the highest counts)."""
    return f"{COMPACTED_INDEX}{history_ref[len(HISTORY):]}/{seq:012d}"


def parse_compacted_key(key: str) -> tuple[str, int]:
    """(history ref, seq) of a :func:`compacted_key`."""
    ref, seq = key[len(COMPACTED_INDEX):].rsplit("/", 1)
    return HISTORY + ref, int(seq)


def node_shard(node_id: str) -> str:
    """The node record's hashed prefix: 2 hex of xxh3-64 of the id (256 shards, so S3 can split the
    fleet's record traffic over partitions instead of one ``inventory/nodes/`` prefix)."""
    return f"{xxhash.xxh3_64_intdigest(node_id.encode()) & 0xFF:02x}"


def node_key(node_id: str) -> str:
    """``inventory/nodes/<shard>/<node id>.json``: where a node's record is written."""
    return f"{NODES}{node_shard(node_id)}/{node_id}.json"


def legacy_node_key(node_id: str) -> str:
    """``inventory/nodes/<node id>.json``: where records were written before the shards (still read;
    a node's next write moves its record to :func:`node_key`)."""
    return f"{NODES}{node_id}.json"


def node_of_node_key(key: str) -> str:
    """The node id a record key (sharded or legacy) names."""
    return key.rsplit("/", 1)[1][:-len(".json")]


def is_legacy_node_key(key: str) -> bool:
    return "/" not in key[len(NODES):]


def touch_key(digest: str) -> str:
    """When a publish last relied on a blob (mutable; garbage collection honours it)."""
    return f"{TOUCHES}{hex_of(digest)}.json"


def digest_of_blob_key(key: str) -> str:
    """The digest a ``blobs/xx/<hex>`` key names."""
    return "xxh3-128:" + key.rsplit("/", 1)[1]


def revocation_key(when: str, record_id: str) -> str:
    """A key revocation record (create-only; the set of them is the revocation list)."""
    return _timed_record_key(REVOCATIONS, when, record_id)


def pending_key(profile: str, channel: str, compat_key: str) -> str:
    """A promotion waiting for more promoter signatures (k-of-n channels; compare-and-swap)."""
    return f"{PENDING}{profile}/{channel}/{compat_key}.json"


# --- the node index: markers derived from each node record (docs/store-layout.md) ---------------
# Empty objects whose keys carry the facts, so one LIST (1,000 keys a page on S3) answers what a
# GET of every node record answered: who serves a profile on a compat key, how each node is doing
# with an artifact on a channel, which artifacts nodes hold. The node writes them with its record
# (new markers before the record, stale ones deleted after it); `buildctl index rebuild` derives
# them all from the records, and `buildctl index check` (and scrub) compares.
NODE_INDEX = "inventory/index/"
NODE_INDEX_META = f"{NODE_INDEX}meta.json"  # written by a rebuild: readers use the index only once it exists


def scope_prefix(profile: str, backend: str, compat_key: str) -> str:
    """Nodes that serve ``profile`` and resolve ``compat_key`` of ``backend``."""
    return f"{NODE_INDEX}scope/{profile}/{backend}/{compat_key}/"


def pulled_scope_prefix(profile: str, channel: str, backend: str, compat_key: str) -> str:
    """Nodes that do not serve ``profile`` but pulled it on ``channel``, resolving ``compat_key``."""
    return f"{NODE_INDEX}pulled/{profile}/{channel}/{backend}/{compat_key}/"


def demand_prefix(profile: str, backend: str) -> str:
    """``<compat key>/<node id>``: nodes serving ``profile`` on their current key of ``backend``."""
    return f"{NODE_INDEX}demand/{profile}/{backend}/"


def status_prefix(profile: str, channel: str, artifact_id: str) -> str:
    """``<node id>.<state>``: each node's state with the artifact on the channel (installed,
    healthy, failed; refused: a pull of it refused on its bytes, quarantine or signature)."""
    return f"{NODE_INDEX}status/{profile}/{channel}/{hex_of(artifact_id)}/"


HELD_INDEX = f"{NODE_INDEX}held/"


def held_key(artifact_id: str, node_id: str, how: str) -> str:
    """``held/<artifact hex>/<node id>.<how>``: the node reports the artifact installed, current or previous."""
    return f"{HELD_INDEX}{hex_of(artifact_id)}/{node_id}.{how}"


def parse_held_key(key: str) -> tuple[str, str, str]:
    """(artifact id, node id, how) of a :func:`held_key`."""
    artifact_hex, leaf = key[len(HELD_INDEX):].split("/", 1)
    node_id, how = leaf.rsplit(".", 1)
    return "xxh3-128:" + artifact_hex, node_id, how
