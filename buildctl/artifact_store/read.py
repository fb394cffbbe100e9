"""Reading artifacts with verification: manifests checked against their id on every read
(dvc-objects style), id resolution, listing, and ``verify`` (sizes, or every byte with ``deep``)."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

from buildctl.core.digest import Hasher, digest_bytes, stream_hasher
from buildctl.core.errors import BuildctlError
from buildctl.artifact_store.backends import memo
from buildctl.artifact_store.backends.store import ProgressFn, Store
from buildctl.artifact_store.errors import (
    ArtifactNotFoundError,
    CorruptObjectError,
    FileProblem,
    KeyNotFoundError,
    ManifestError,
    VerificationError,
)
from buildctl.artifact_store.backends.listing import map_bounded
from buildctl.artifact_store.backends.ranged import RangedReader, ShortRangeError
from buildctl.artifact_store.layout import (
    MANIFESTS,
    artifact_of_manifest_key,
    artifact_of_pair_key,
    blob_key,
    manifest_key,
    manifest_prefix,
    pair_prefix,
)
from buildctl.artifact_store.manifest import FileEntry, Manifest, content_problem, parse_manifest

BUILD_LOG_PATH = "<build log>"


def parse_verified_manifest(body: bytes, artifact_id: str | None, key: str) -> Manifest:
    """Parse manifest bytes; with ``artifact_id``, they must hash to it."""
    if artifact_id is not None and digest_bytes(body) != artifact_id:
        raise CorruptObjectError(key, f"manifest bytes hash to {digest_bytes(body)}, not {artifact_id}")
    return parse_manifest(body, key)


def resolve_artifact(store: Store, ref: str) -> str:
    """A full artifact id from a full id, ``xxh3-128:``-less hex, or a unique hex prefix (>= 8)."""
    h = ref[len("xxh3-128:"):] if ref.startswith("xxh3-128:") else ref
    h = h.lower()
    if not (8 <= len(h) <= 32) or any(c not in "0123456789abcdef" for c in h):
        raise ArtifactNotFoundError(ref, "expected an artifact id or a hex prefix of at least 8 characters")
    if len(h) == 32:
        artifact = "xxh3-128:" + h
        if store.stat(manifest_key(artifact)) is None:
            raise ArtifactNotFoundError(artifact)
        return artifact
    matches = list(store.list(manifest_prefix(h)))
    if not matches:
        raise ArtifactNotFoundError(ref)
    if len(matches) > 1:
        raise ArtifactNotFoundError(ref, f"prefix is ambiguous ({len(matches)} artifacts)")
    return artifact_of_manifest_key(matches[0])


def get_manifest(store: Store, artifact_id: str) -> Manifest:
    """Read a manifest and verify it hashes to its id (dvc-style verify on read)."""
    return get_manifest_and_bytes(store, artifact_id)[0]


def get_manifest_and_bytes(store: Store, artifact_id: str) -> tuple[Manifest, bytes]:
    """:func:`get_manifest`, with the bytes that hash to the id (a node keeps them)."""
    got = memo.kept(store, artifact_id)
    if got is not None:
        return got
    key = manifest_key(artifact_id)
    try:
        body = store.get_bytes(key)
    except KeyNotFoundError:
        raise ArtifactNotFoundError(artifact_id) from None
    got = parse_verified_manifest(body, artifact_id, key), body
    memo.keep(store, artifact_id, got)
    return got


def list_artifacts(store: Store, profile: str | None = None) -> list[tuple[str, Manifest]]:
    """Every artifact (optionally of one profile), newest first."""
    out = [(a, m) for a, m in _manifests(store, [artifact_of_manifest_key(k) for k in store.list(MANIFESTS)])
           if profile is None or m.profile_name == profile]
    out.sort(key=lambda am: am[1].created_at, reverse=True)
    return out


def _manifest_or_none(store: Store, artifact: str) -> Manifest | None:
    try:
        return get_manifest(store, artifact)
    except (ArtifactNotFoundError, ManifestError, CorruptObjectError):
        return None


def _manifests(store: Store, artifacts: list[str]) -> list[tuple[str, Manifest]]:
    """(artifact, manifest) of those whose manifest reads and verifies, read at once, in order."""
    got = map_bounded(lambda a: _manifest_or_none(store, a), artifacts)
    return [(a, m) for a, m in zip(artifacts, got) if m is not None]


def artifacts_built_from(store: Store, profile: str, profile_hash: str) -> list[tuple[str, Manifest]]:
    """The artifacts of ``profile`` built from ``profile_hash``, newest first, from the pair
    index (``index/pairs/``: one LIST, then each of those manifests). Only a store whose index
    is built has a marker for every manifest (``buildctl index rebuild``)."""
    # A manifest that is missing (a publish died between its marker and its manifest) or damaged is passed over.
    out = [(a, m) for a, m in _manifests(store, [artifact_of_pair_key(k) for k in store.list(pair_prefix(profile, profile_hash))])
           if m.profile_name == profile and m.profile_hash == profile_hash]
    out.sort(key=lambda am: am[1].created_at, reverse=True)
    return out


def scan_manifests(store: Store, known: dict[str, tuple[Manifest | None, str, set[str] | None]] | None = None,
                   ) -> Iterator[tuple[str, Manifest | None, str, set[str] | None]]:
    """Every manifest in the store: ``(artifact, manifest, "", None)`` when it verifies, else
    ``(artifact, None, why, digests)`` with the blob digests its bytes still name (None: none).
    ``known``: what an earlier scan of this store found, by artifact; a manifest listed again that
    verified then is not read again (its key is its digest). The manifests are read
    :data:`~buildctl.artifact_store.backends.listing.LIST_WORKERS` at once."""

    def one(key: str) -> tuple[str, Manifest | None, str, set[str] | None]:
        artifact = artifact_of_manifest_key(key)
        seen = (known or {}).get(artifact)
        if seen is not None and seen[0] is not None:
            return artifact, *seen
        try:
            return artifact, get_manifest(store, artifact), "", None
        except (ArtifactNotFoundError, ManifestError, CorruptObjectError) as err:
            try:
                named = set(re.findall(r"xxh3-128:[0-9a-f]{32}", store.get_bytes(key).decode("utf-8", "replace")))
            except (BuildctlError, OSError):
                named = set()
            named.discard(artifact)
            return artifact, None, str(err).splitlines()[0], named or None

    yield from map_bounded(one, list(store.list(MANIFESTS)))


def blob_entries(store: Store, manifest: Manifest) -> list[FileEntry]:
    """The manifest's files and, when it kept one, its build log as an entry (:data:`BUILD_LOG_PATH`,
    sized as stored: the manifest records no size for the log)."""
    entries: list[FileEntry] = list(manifest.files)
    if manifest.build_log:
        entries.append(FileEntry(path=BUILD_LOG_PATH, size=store.stat(blob_key(manifest.build_log)) or 0,
                                 digest=manifest.build_log, blake3=manifest.build_log_blake3))
    return entries


def stored_hash(store: Store, ranged: RangedReader, e: FileEntry, *, crypto: bool, deep: bool = True,
                on_bytes: ProgressFn | None = None, xxh: bool = True) -> tuple[Hasher | None, FileProblem | None]:
    """Check that ``e``'s blob exists with its size and, with ``deep``, re-hash it from the store
    (parallel ranges where ``ranged`` applies, hashed in order; ``crypto``: BLAKE3 too; ``xxh=False``:
    BLAKE3 alone). Returns the hasher (None when not ``deep``) or what is wrong (missing, size); the
    caller compares digests."""
    key = blob_key(e.digest)
    size = store.stat(key)
    if size is None:
        return None, FileProblem(e.path, "missing", actual=f"blob {key} does not exist")
    if e.path != BUILD_LOG_PATH and size != e.size:
        return None, FileProblem(e.path, "size", e.size, size)
    if not deep:
        return None, None
    if ranged.applies(size):  # parallel ranges, hashed in order
        try:
            return ranged.hash_object(key, size, on_bytes=on_bytes, crypto=crypto, xxh=xxh), None
        except ShortRangeError as err:
            return None, FileProblem(e.path, "size", e.size, err.offset + err.got)
    with store.open_read(key) as f:
        h = stream_hasher(f, crypto=crypto, xxh=xxh)
    if on_bytes:
        on_bytes(h.size)
    return h, None


def verify(store: Store, artifact_id: str, *, deep: bool = False, workers: int = 4,
           on_bytes: ProgressFn | None = None) -> Manifest:
    """Check every blob exists with the right size; ``deep`` re-hashes every byte once: by BLAKE3-256
    alone where the manifest entry carries it (schema 2: a match pins the bytes the manifest's
    author hashed, docs/threat-model.md), by xxh3-128 where it does not. Only a file that fails is
    read a second time, with both, to say whether it rotted (``digest``) or was made to collide
    (``blake3``). Raises :class:`VerificationError`."""
    manifest = get_manifest(store, artifact_id)

    def check(e: FileEntry) -> FileProblem | None:
        crypto = e.blake3 is not None
        h, problem = stored_hash(store, ranged, e, crypto=crypto, deep=deep, on_bytes=on_bytes, xxh=not crypto)
        if problem is not None or h is None:
            return problem
        if crypto and h.crypto() == e.blake3:
            return None
        if crypto:  # a mismatch (rare): both digests, to name it
            h, problem = stored_hash(store, ranged, e, crypto=True, deep=True)
            if h is None:  # deep: no hasher only with a problem (gone or resized since)
                return problem
        return content_problem(e.path, e.digest, e.blake3, h)

    with RangedReader(store) as ranged, ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        problems = [p for p in pool.map(check, blob_entries(store, manifest)) if p is not None]
    if problems:
        raise VerificationError(artifact_id, problems)
    return manifest
