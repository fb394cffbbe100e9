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

Nothing is re-exported here: a caller imports each name from the module that holds it.
"""
