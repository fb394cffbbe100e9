"""``buildctl.artifact_store.backends``: keys and bytes, nothing else (restic's ``internal/backend``).

* :mod:`.store`: the :class:`~.store.Store` protocol and ``open_store``, with the URI scheme → backend
  registry (``STORE_BACKENDS``, imported on first use, so no backend imports its opener);
* :mod:`.local`: the local directory (``file://``), the default; :mod:`.s3`: S3 (``s3://``), the only
  boto3 importer;
* :mod:`.ranged`: parallel ranged reads of large blobs, hashed in order; :mod:`.listing`: many
  requests and large listings at once; :mod:`.pools`: thread pools an interrupt does not wait for;
* :mod:`.memo`: the manifests a command's store has read and verified (one load per manifest).
"""
