"""``buildctl.artifact_store.node``: what a node does with the store.

* :mod:`.pull`: resolve a channel for this host and install its artifact;
* :mod:`.admission`: whether a node may trust a channel record (fresh, signed, not revoked);
* :mod:`.download`: an artifact's files, verified while they arrive;
* :mod:`.install_dir`: the node's install directory (versions, ``current``, staging, the swap);
* :mod:`.checkpoints`: model checkpoints from a store location, verified;
* :mod:`.export_signature`: an OpenSSF Model Signing bundle for an installed engine.
"""
