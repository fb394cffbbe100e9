"""The node index: what the fleet's node records say, as empty marker objects one LIST can read.

Fleet-wide operations used to GET every node record (``read_inventory``): 100,000 requests for
one ``rollout status`` at 100,000 nodes. Each fact those operations need is also written as the
key of an empty object under ``inventory/index/`` (:mod:`buildctl.artifact_store.layout`), so a
LIST of 1,000 keys a page answers it:

* ``scope/<profile>/<backend>/<compat key>/<node>``: the node serves the profile and resolves
  that key (its recorded key, or its fingerprint's key now or under schema 1), and
  ``pulled/<profile>/<channel>/<backend>/<compat key>/<node>``: it does not serve the profile
  but pulled it on that channel: together, the nodes a channel ref reaches
  (``rollouts.nodes_in_scope``);
* ``demand/<profile>/<backend>/<compat key>/<node>``: the node serves the profile on its current
  key: what the reconcile plan counts (``fleet.plan_builds``);
* ``status/<profile>/<channel>/<artifact>/<node>.<state>``: the node's engine state with that
  artifact (installed, healthy, failed), or ``refused`` (a pull of it refused on its bytes,
  quarantine or signature): a rollout's wave counts;
* ``held/<artifact>/<node>.<how>``: installed, current or previous on the node: what gc keeps.

Beside them, the pair index ``index/pairs/<profile>/<build hash>/<artifact>`` (written at publish,
before the manifest; removed by gc with the artifact) lets the reconcile plan read only the
artifacts of its profiles' current build hashes instead of every manifest.

Every node marker is a pure function of one node record (:func:`node_markers`). A node writes the ones
its new record adds before the record and deletes the ones it drops after it
(``inventory.update_node``), so a crash leaves extra markers, never missing ones. Readers treat
the index as a hint where it matters: a rollout halts only on failures it has confirmed in the
failed nodes' own records, and two states for one node are settled by reading its record.

A store written before the index has node records and no markers: readers use the index only
once ``inventory/index/meta.json`` exists, which :func:`rebuild` (``buildctl index rebuild``, the
migration) writes after deriving every marker from the records (and every pair marker from the
manifests). :func:`rebuild` with ``repair=False`` (``buildctl index check``) reports missing and
stale markers; ``scrub`` runs it with ``repair=True`` once the index is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from buildctl.artifact_store.backends.store import Store
from buildctl.artifact_store.fleet.inventory import (
    NodeRecord,
    held_markers,
    index_built,
    read_inventory,
    read_node,
    status_markers,
)
from buildctl.artifact_store.layout import (
    NODE_INDEX,
    NODE_INDEX_META,
    NODES,
    node_of_node_key,
    PAIR_INDEX,
    artifact_of_pair_key,
    demand_prefix,
    manifest_key,
    pair_key,
    pulled_scope_prefix,
    scope_prefix,
    status_prefix,
)
from buildctl.artifact_store.backends.listing import hex_bounds, list_ranges
from buildctl.artifact_store.read import list_artifacts
from buildctl.core.digest import canonical_json
from buildctl.engines.errors import FingerprintError
from buildctl.engines.fingerprint import Fingerprint, parse_fingerprint
from buildctl.engines.registry import backend_names
from buildctl.core.times import utc_now

INDEX_FORMAT = 1
INDEX_WRITERS = 16  # markers written or deleted at once by a rebuild


def node_fingerprint(record: NodeRecord) -> Fingerprint | None:
    """The fingerprint a node record holds (None when this version cannot read it)."""
    try:
        return parse_fingerprint(record.fingerprint, f"inventory record of {record.node_id}")
    except FingerprintError:
        return None


def node_compat_keys(record: NodeRecord) -> dict[str, str]:
    """A node's compat key per backend, computed from its recorded fingerprint by this version
    (the record's own ``compat_keys`` may be schema-1 keys)."""
    return _compat_keys(record, node_fingerprint(record))


def _compat_keys(record: NodeRecord, fp: Fingerprint | None) -> dict[str, str]:
    return {b: fp.compat_key(b) for b in backend_names()} if fp is not None else dict(record.compat_keys)


def resolved_keys(record: NodeRecord, backend: str, fp: Fingerprint | None) -> set[str]:
    """Every compat key of ``backend`` a channel ref may be under and still reach this node: the
    key its record holds, and its fingerprint's (``fp``: :func:`node_fingerprint`) now and under
    schema 1."""
    keys = {record.compat_keys[backend]} if backend in record.compat_keys else set()
    if fp is not None:
        keys |= {fp.compat_key(backend), fp.legacy_compat_key(backend)}
    return keys


def node_markers(record: NodeRecord) -> set[str]:
    """Every node-index key this record implies."""
    out = held_markers(record) | status_markers(record)
    pulled = {(e.profile, e.channel) for e in record.engines if e.profile not in record.profiles}
    fp = node_fingerprint(record)  # parsed once: a rebuild derives 100,000 records' markers
    current = _compat_keys(record, fp)
    for backend in backend_names():
        keys = resolved_keys(record, backend, fp)
        for profile in record.profiles:
            out |= {f"{scope_prefix(profile, backend, k)}{record.node_id}" for k in keys}
        for profile, channel in pulled:
            out |= {f"{pulled_scope_prefix(profile, channel, backend, k)}{record.node_id}" for k in keys}
        if backend in current:
            out |= {f"{demand_prefix(profile, backend)}{current[backend]}/{record.node_id}" for profile in record.profiles}
    return out


def node_of_marker(key: str) -> str:
    """The node id a marker key names."""
    kind, leaf = key[len(NODE_INDEX):].split("/", 1)[0], key.rsplit("/", 1)[1]
    return leaf.rsplit(".", 1)[0] if kind in ("status", "held") else leaf


# --- reading -------------------------------------------------------------------------------------


def scope_nodes(store: Store, profile: str, channel: str, backend: str, compat_key: str) -> set[str]:
    """The nodes a channel ref reaches (``rollouts.nodes_in_scope``): serving the profile, or
    having pulled it on this channel, on the key."""
    out: set[str] = set()
    for prefix in (scope_prefix(profile, backend, compat_key), pulled_scope_prefix(profile, channel, backend, compat_key)):
        out |= {k[len(prefix):] for k in store.list(prefix)}
    return out


STATUS_STATES = frozenset({"installed", "healthy", "failed", "refused"})
MALFORMED_MARKER = "malformed status marker (not <node>.<installed|healthy|failed|refused>)"
UNREADABLE = "?"  # a node named by a malformed marker: its own record decides (``state_of`` is unsure)


def status_states(store: Store, profile: str, channel: str, artifact_id: str,
                  skipped: list[tuple[str, str]] | None = None) -> dict[str, set[str]]:
    """node id -> the states its markers give it with the artifact on the channel. A malformed
    marker (any node role can write one) is passed over and listed in ``skipped``; when it still
    names a node, that node's state is unsure, so its record is read (:func:`state_of`)."""
    prefix = status_prefix(profile, channel, artifact_id)
    out: dict[str, set[str]] = {}
    for key in store.list(prefix):
        node_id, dot, state = key[len(prefix):].rpartition(".")
        if not dot or not node_id or "/" in node_id or state not in STATUS_STATES:
            if skipped is not None:
                skipped.append((key, MALFORMED_MARKER))
            if node_id and "/" not in node_id:
                out.setdefault(node_id, set()).add(UNREADABLE)
            continue
        out.setdefault(node_id, set()).add(state)
    return out


def state_of(states: set[str]) -> str | None:
    """A node's rollout status from its markers (``rollouts.node_status``'s rule), or None when
    they disagree (an interrupted update left two engine states) or one is malformed: read its record."""
    if UNREADABLE in states:
        return None
    engine = states - {"refused"}
    if len(engine) > 1:
        return None
    if engine:
        return next(iter(engine))
    return "failed" if "refused" in states else "pending"


def demand_counts(store: Store, profile: str, backend: str) -> dict[str, int]:
    """compat key -> nodes serving ``profile`` on it (the reconcile plan's demand)."""
    prefix = demand_prefix(profile, backend)
    counts: dict[str, int] = {}
    # One marker per node: on S3, 16 ranges of compat keys (``<backend>-<hex>``) listed at once.
    for key in list_ranges(store, prefix, hex_bounds(f"{prefix}{backend}-")):
        compat_key = key[len(prefix):].split("/", 1)[0]
        counts[compat_key] = counts.get(compat_key, 0) + 1
    return counts


# --- rebuild and check ---------------------------------------------------------------------------


@dataclass
class IndexReport:
    """What a rebuild or check found: markers the records imply and the index lacks (missing),
    and markers no record implies (stale)."""

    nodes: int = 0
    markers: int = 0
    missing: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    repaired: bool = False
    ready: bool = False

    @property
    def ok(self) -> bool:
        return not self.missing and not self.stale

    def to_json(self) -> dict:
        return {"nodes": self.nodes, "markers": self.markers, "missing": self.missing, "stale": self.stale,
                "skipped": [{"key": k, "why": w} for k, w in self.skipped], "repaired": self.repaired,
                "ready": self.ready, "ok": self.ok}


def rebuild(store: Store, *, repair: bool = True) -> IndexReport:
    """Derive every marker from the node records and compare with the index. With ``repair``,
    write the missing ones, delete the stale ones and mark the index built (the migration of a
    store written before it). The index is listed before the records are read, so a marker a node
    writes meanwhile is never taken for stale; a stale one is deleted only after its node's
    record, read again, still does not imply it, and put back when the record read after the
    delete implies it (an update swapped in meanwhile). A malformed record's markers are kept."""
    from buildctl.artifact_store.backends.pools import interruptible_pool

    listed = {k for k in store.list(NODE_INDEX) if k != NODE_INDEX_META} | set(store.list(PAIR_INDEX))
    report = IndexReport()
    records = read_inventory(store, report.skipped)
    expected: set[str] = set()
    for rec in records:
        expected |= node_markers(rec)
    expected |= {pair_key(m.profile_name, m.profile_hash, a) for a, m in list_artifacts(store)}
    unreadable = {node_of_node_key(k) for k, _ in report.skipped if k.startswith(NODES)}
    report.nodes, report.markers = len(records), len(expected)
    report.missing = sorted(expected - listed)
    report.stale = sorted(k for k in listed - expected if k.startswith(PAIR_INDEX) or node_of_marker(k) not in unreadable)
    if repair:
        def still_stale(key: str) -> bool:
            if key.startswith(PAIR_INDEX):  # a publish that died before its manifest, or one gc removed
                return store.stat(manifest_key(artifact_of_pair_key(key))) is None
            got = read_node(store, node_of_marker(key))
            return got is None or key not in node_markers(got[0])

        def implied_again(key: str) -> bool:  # a node swapped its record while this key was deleted
            if key.startswith(PAIR_INDEX):
                return store.stat(manifest_key(artifact_of_pair_key(key))) is not None
            got = read_node(store, node_of_marker(key))
            return got is not None and key in node_markers(got[0])

        with interruptible_pool(INDEX_WRITERS, "index") as (pool, _):
            list(pool.map(lambda k: store.put_bytes(k, b""), report.missing))
            confirmed = [k for k, stale in zip(report.stale, pool.map(still_stale, report.stale)) if stale]
            list(pool.map(store.delete, confirmed))
            # A node whose update was in flight (markers written, record not yet swapped) swaps it
            # now or later: after the delete, each node read once more; what its record implies is
            # put back (and the node's own update puts its markers again after its swap).
            back = [k for k, yes in zip(confirmed, pool.map(implied_again, confirmed)) if yes]
            list(pool.map(lambda k: store.put_bytes(k, b""), back))
        report.stale = [k for k in confirmed if k not in set(back)]
        if not index_built(store):
            store.put_bytes(NODE_INDEX_META, canonical_json({"format": INDEX_FORMAT, "built_at": utc_now(),
                                                             "nodes": report.nodes}))
        report.repaired = True
    report.ready = index_built(store)
    return report
