"""One load per manifest per command: the manifests a command's store has read and verified.

A manifest is content-addressed (its bytes hash to its artifact id), so a copy kept after it
verified cannot go stale: the steps of one command (a pull's channel target, its signature
check and its install; a promote's gates and its record) share one read. The
:class:`~buildctl.steps.context.Context` turns this on for the store it opens for a command or a flow
run (:func:`remember_manifests`); a store passed in (tests, a repair source) reads every time.
Only bytes that verified are kept, so a rotted or missing manifest is read, and fails, as before.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from buildctl.artifact_store.backends.store import Store
from buildctl.artifact_store.layout import manifest_key

if TYPE_CHECKING:
    from buildctl.artifact_store.manifest import Manifest

_MEMOS: "weakref.WeakKeyDictionary[Any, dict[str, tuple[Manifest, bytes]]]" = weakref.WeakKeyDictionary()


def remember_manifests(store: Store) -> Store:
    """Keep every manifest read and verified through ``store`` (this object) from now on."""
    _MEMOS.setdefault(store, {})
    return store


def kept(store: Store, artifact_id: str) -> "tuple[Manifest, bytes] | None":
    memo = _MEMOS.get(store)
    return None if memo is None else memo.get(artifact_id)


def keep(store: Store, artifact_id: str, got: "tuple[Manifest, bytes]") -> None:
    """Keep a manifest and its bytes, which the caller verified hash to ``artifact_id``."""
    memo = _MEMOS.get(store)
    if memo is not None:
        memo[artifact_id] = got


def manifest_bytes(store: Store, artifact_id: str) -> bytes:
    """The manifest's bytes: the kept copy, or one GET (unverified: the caller checks them)."""
    got = kept(store, artifact_id)
    return got[1] if got is not None else store.get_bytes(manifest_key(artifact_id))
