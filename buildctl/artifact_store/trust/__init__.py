"""``buildctl.artifact_store.trust``: who signed what, and whether it still counts.

* :mod:`.signing`: Ed25519 keys and signatures; :mod:`.authority`: who acts, with which keys
  (one value per command); :mod:`.revocation`: key revocations;
* :mod:`.binding`: signed records bound to a manifest's exact bytes, and ``--require-crypto``;
* :mod:`.attestations`: the typed, signed validation record; :mod:`.provenance`: SLSA build
  provenance in a DSSE envelope.
"""
