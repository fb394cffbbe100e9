"""``buildctl.artifact_store.upkeep``: keeping stored artifacts whole (restic's ``check``/``repair``).

* :mod:`.integrity`: deep checks at the gates, quarantining on a mismatch;
* :mod:`.repair`: put back exactly the blobs whose bytes are wrong, from a proven copy;
* :mod:`.rehash`: a BLAKE3 (schema 2) manifest for an artifact published before BLAKE3.
"""
