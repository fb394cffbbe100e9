"""Manifests: the list of files of one artifact, and what it was built from and for.

The artifact id is the digest of the manifest's canonical JSON, so a manifest can never
change without changing its id. Path rules are enforced before anything is written.

Schema 2 (current) gives every file, and the build log, a BLAKE3-256 digest beside its xxh3-128
one, so a signed manifest binds its files' bytes cryptographically. Schema 1 manifests (written
before it) have xxh3-128 only; they still parse and verify by xxh3, :attr:`Manifest.crypto` is
False for them, and ``--require-crypto`` refuses them (``buildctl rehash`` upgrades one).
"""

from __future__ import annotations

import json
import os
import stat
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pydantic import (
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from buildctl.core.records import Record
from buildctl.core.digest import (
    CRYPTO_RE,
    DIGEST_RE,
    Crc64Nvme,
    canonical_json,
    crypto_bytes,
    digest_bytes,
    digest_json,
    file_hasher,
    Hasher,
)
from buildctl.artifact_store.errors import FileProblem, ManifestError, UnsafeTreeError

MANIFEST_SCHEMA_VERSION = 2
LEGACY_SCHEMA_VERSION = 1  # xxh3-128 only: read, verified by xxh3, refused under --require-crypto
READ_SCHEMA_VERSIONS = (LEGACY_SCHEMA_VERSION, MANIFEST_SCHEMA_VERSION)
MAX_PATH_LEN = 1024
MAX_COMPONENT_LEN = 255


def check_relpath(path: str) -> str:
    """Return ``path`` if it is a safe relative POSIX path, else raise ``ValueError`` saying why."""
    if not isinstance(path, str) or not path:
        raise ValueError("empty path")
    if len(path.encode()) > MAX_PATH_LEN:
        raise ValueError(f"path longer than {MAX_PATH_LEN} bytes")
    if "\x00" in path or any(ord(c) < 32 for c in path):
        raise ValueError("control character in path")
    if "\\" in path:
        raise ValueError("backslash in path (paths are POSIX)")
    if path.startswith("/") or (len(path) > 1 and path[1] == ":"):
        raise ValueError("absolute path")
    if unicodedata.normalize("NFC", path) != path:
        raise ValueError("path is not NFC-normalised unicode")
    parts = path.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise ValueError(f"path component {part!r} not allowed")
        if len(part.encode()) > MAX_COMPONENT_LEN:
            raise ValueError(f"path component longer than {MAX_COMPONENT_LEN} bytes")
    return path


def check_unique_paths(paths: list[str]) -> None:
    """Refuse duplicates, case-only duplicates, and a file that is also a directory prefix."""
    seen: dict[str, str] = {}
    exact: set[str] = set()
    for p in paths:
        if p in exact:
            raise ValueError(f"duplicate path {p!r}")
        exact.add(p)
        folded = p.casefold()
        if folded in seen:
            raise ValueError(f"case-only duplicate paths {seen[folded]!r} and {p!r}")
        seen[folded] = p
    for p in paths:
        parts = p.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in exact:
                raise ValueError(f"path {'/'.join(parts[:i])!r} is both a file and a directory")


class FileEntry(Record):
    """One file of an artifact."""

    path: str = Field(..., description="Relative POSIX path inside the artifact.")
    size: int = Field(..., ge=0, description="Size in bytes.")
    digest: str = Field(..., description="xxh3-128 digest of the content; also the blob's key.")
    executable: bool = Field(False, description="Whether the file is installed with the executable bit.")
    blake3: str | None = Field(None, description="BLAKE3-256 of the content (schema 2); absent in schema 1 manifests.")

    @model_serializer(mode="wrap")
    def _omit_absent_blake3(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        out = handler(self)
        if out.get("blake3") is None:
            out.pop("blake3", None)  # a schema 1 entry dumps exactly as it was written
        return out

    @field_validator("blake3")
    @classmethod
    def _blake3_form(cls, v: str | None) -> str | None:
        if v is not None and not CRYPTO_RE.match(v):
            raise ValueError("blake3 must be blake3:<64 lowercase hex>")
        return v

    @field_validator("path")
    @classmethod
    def _safe_path(cls, v: str) -> str:
        return check_relpath(v)

    @field_validator("digest")
    @classmethod
    def _digest_form(cls, v: str) -> str:
        if not DIGEST_RE.match(v):
            raise ValueError("digest must be xxh3-128:<32 lowercase hex>")
        return v


class Manifest(Record):
    """The immutable description of one artifact."""

    schema_version: int = Field(MANIFEST_SCHEMA_VERSION, description="Manifest schema version; unknown versions are refused.")
    files: tuple[FileEntry, ...] = Field(..., min_length=1, description="Every file, sorted by path.")
    profile_name: str = Field(..., description="The build profile's name.")
    profile_hash: str = Field(..., description="The profile's build-affecting hash.")
    build_key: str | None = Field(None, description="The build key (profile hash, model digest, compat key, backend version); None for imports without a model digest.")
    backend: str = Field(..., pattern=r"^[a-z0-9][a-z0-9_-]{0,31}$", description="The builder backend that made the engine (a name in the engine registry).")
    compat_key: str = Field(..., description="The builder host's compat key for this backend: where the engine may run.")
    fingerprint: dict[str, Any] = Field(..., description="The builder host's full fingerprint.")
    tool_versions: dict[str, str | None] = Field(default_factory=dict, description="Backend and tool versions (torch, tensorrt_llm, buildctl, ...).")
    model_digest: str | None = Field(None, description="Digest of the model checkpoint the engine was built from, when known.")
    created_at: str = Field(..., description="UTC ISO-8601 time the manifest was written.")
    build_log: str | None = Field(None, description="Digest of the build-log blob, when the build kept one.")
    build_log_blake3: str | None = Field(None, description="BLAKE3-256 of the build log (schema 2, with a build log).")
    rehashed_from: str | None = Field(None, description="`buildctl rehash`: the schema 1 artifact whose files, re-read from the store, this manifest lists with BLAKE3 (the same paths, sizes, xxh3 digests and modes).")

    @model_serializer(mode="wrap")
    def _omit_absent_schema_2_fields(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        out = handler(self)
        for name in ("build_log_blake3", "rehashed_from"):  # a schema 1 manifest dumps exactly as it was written
            if out.get(name) is None:
                out.pop(name, None)
        return out

    @model_validator(mode="before")
    @classmethod
    def _known_version(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("schema_version", LEGACY_SCHEMA_VERSION) not in READ_SCHEMA_VERSIONS:
            raise ValueError(f"unknown manifest schema_version {data.get('schema_version')!r} "
                             f"(this buildctl reads {', '.join(map(str, READ_SCHEMA_VERSIONS))})")
        return data

    @model_validator(mode="after")
    def _paths(self) -> "Manifest":
        paths = [f.path for f in self.files]
        if paths != sorted(paths):
            raise ValueError("files must be sorted by path")
        check_unique_paths(paths)
        for d in (self.build_log, self.model_digest):
            if d is not None and not DIGEST_RE.match(d):
                raise ValueError(f"bad digest {d!r}")
        return self

    @model_validator(mode="after")
    def _digests_match_version(self) -> "Manifest":
        crypto = self.schema_version >= MANIFEST_SCHEMA_VERSION
        for f in self.files:
            if (f.blake3 is not None) != crypto:
                raise ValueError(f"{f.path}: schema {self.schema_version} manifests "
                                 f"{'need' if crypto else 'have no'} a blake3 digest per file")
        if crypto and (self.build_log is None) != (self.build_log_blake3 is None):
            raise ValueError("build_log and build_log_blake3 come together")
        if not crypto and (self.build_log_blake3 is not None or self.rehashed_from is not None):
            raise ValueError("schema 1 manifests have no build_log_blake3 or rehashed_from")
        if self.rehashed_from is not None and not DIGEST_RE.match(self.rehashed_from):
            raise ValueError(f"bad artifact id {self.rehashed_from!r}")
        if self.build_log_blake3 is not None and not CRYPTO_RE.match(self.build_log_blake3):
            raise ValueError(f"bad digest {self.build_log_blake3!r}")
        return self

    def canonical(self) -> bytes:
        return canonical_json(self.model_dump(mode="json"))

    def artifact_id(self) -> str:
        """The digest of this manifest's canonical JSON."""
        return digest_bytes(self.canonical())

    def identity(self) -> str:
        """The digest of everything but ``created_at``: equal for re-publishes of the same content."""
        data = self.model_dump(mode="json")
        data.pop("created_at")
        return digest_bytes(canonical_json(data))

    @property
    def crypto(self) -> bool:
        """Whether every file (and the build log) carries a BLAKE3-256 digest (schema 2)."""
        return self.schema_version >= MANIFEST_SCHEMA_VERSION

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    def same_files(self, other: "Manifest") -> bool:
        """Whether both list the same files (paths, sizes, xxh3-128 digests, modes) and build log,
        whatever BLAKE3 digests either carries: what a rehash keeps."""
        def plain(m: Manifest) -> tuple:
            return tuple((f.path, f.size, f.digest, f.executable) for f in m.files), m.build_log
        return plain(self) == plain(other)

    def blob_digests(self) -> set[str]:
        out = {f.digest for f in self.files}
        if self.build_log:
            out.add(self.build_log)
        return out


def content_problem(path: str, digest: str, blake3: str | None, h: Hasher) -> FileProblem | None:
    """What is wrong with bytes hashed into ``h`` (a :class:`Hasher` made with ``crypto`` when
    ``blake3`` is set) against a file's digests: xxh3-128 first, then BLAKE3-256; None when both match."""
    if h.digest() != digest:
        return FileProblem(path, "digest", digest, h.digest())
    if blake3 is not None and h.crypto() != blake3:
        # the same xxh3-128, other bytes: a collision, which only a deliberate attacker makes
        return FileProblem(path, "blake3", blake3, h.crypto())
    return None


def entry_problem(entry: FileEntry, h: Hasher) -> FileProblem | None:
    """:func:`content_problem` for a manifest entry, its size included."""
    if h.size != entry.size:
        return FileProblem(entry.path, "size", entry.size, h.size)
    return content_problem(entry.path, entry.digest, entry.blake3, h)


def checking_hasher(entry: FileEntry) -> Hasher:
    """The hasher for the one read that checks a file against ``entry``: BLAKE3-256 alone where the
    entry carries it (a match pins the bytes the manifest's author hashed; xxh3-128 over the same
    bytes would double the work and add nothing: docs/threat-model.md), xxh3-128 where it does not."""
    crypto = entry.blake3 is not None
    return Hasher(crypto, xxh=not crypto)


def checked_problem(entry: FileEntry, h: Hasher, both: Callable[[], Hasher]) -> FileProblem | None:
    """:func:`entry_problem` for bytes hashed by :func:`checking_hasher`. A BLAKE3 mismatch (rare)
    reads the bytes again through ``both`` (a hasher of both digests) to name it: ``digest`` for
    rot, ``blake3`` for other bytes made to collide."""
    if h.has_xxh or h.size != entry.size:
        return entry_problem(entry, h)
    if h.crypto() == entry.blake3:
        return None
    return entry_problem(entry, both()) or FileProblem(entry.path, "blake3", entry.blake3, h.crypto())


def file_problem(entry: FileEntry, path: str | Path) -> FileProblem | None:
    """What is wrong with the file at ``path`` against ``entry``, read once (:func:`checked_problem`)."""
    crypto = entry.blake3 is not None
    return checked_problem(entry, file_hasher(path, crypto=crypto, xxh=not crypto),
                           lambda: file_hasher(path, crypto=True))


def parse_manifest(data: bytes | str | dict[str, Any], source: str = "<manifest>") -> Manifest:
    """Parse and validate a manifest; raises :class:`ManifestError`."""
    try:
        obj = json.loads(data) if isinstance(data, (bytes, str)) else data
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ManifestError(source, f"not JSON: {err}") from None
    if not isinstance(obj, dict):
        raise ManifestError(source, "not a JSON object")
    try:
        return Manifest.model_validate(obj)
    except ValidationError as err:
        detail = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in err.errors())
        raise ManifestError(source, detail) from None




# --- source trees ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceFile:
    """A regular file found in a source tree."""

    path: str  # relative POSIX path
    abspath: Path
    size: int
    executable: bool


def scan_tree(root: str | Path) -> list[SourceFile]:
    """List the regular files under ``root``, refusing anything a manifest cannot hold.

    Refused, naming the entry: symlinks, device files, sockets, FIFOs, empty directories,
    and any path that breaks :func:`check_relpath` or :func:`check_unique_paths`.
    """
    root = Path(root)
    if not root.is_dir():
        raise UnsafeTreeError(str(root), "not a directory")
    out: list[SourceFile] = []

    def walk(d: Path, rel: str) -> None:
        with os.scandir(d) as it:
            entries = sorted(it, key=lambda e: e.name)
        if not entries and rel:
            raise UnsafeTreeError(rel, "empty directory (a manifest lists files only)")
        for e in entries:
            r = f"{rel}/{e.name}" if rel else e.name
            st = e.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                raise UnsafeTreeError(r, "symlink (artifacts hold regular files only)")
            if stat.S_ISDIR(st.st_mode):
                walk(Path(e.path), r)
                continue
            if not stat.S_ISREG(st.st_mode):
                raise UnsafeTreeError(r, "not a regular file (device, socket or FIFO)")
            try:
                check_relpath(r)
            except ValueError as err:
                raise UnsafeTreeError(r, str(err)) from None
            out.append(SourceFile(r, Path(e.path), st.st_size, bool(st.st_mode & stat.S_IXUSR)))

    walk(root, "")
    if not out:
        raise UnsafeTreeError(str(root), "no files")
    try:
        check_unique_paths([f.path for f in out])
    except ValueError as err:
        raise UnsafeTreeError(str(root), str(err)) from None
    return sorted(out, key=lambda f: f.path)


def hash_tree(
    files: list[SourceFile], *, workers: int | None = None, on_bytes: Callable[[int], None] | None = None,
    crc64: dict[str, str] | None = None, crypto: bool = True,
) -> list[FileEntry]:
    """Hash files concurrently, one thread per core by default (xxhash and blake3 release the GIL
    per slice): xxh3-128 and, with ``crypto`` (the default: schema 2 entries), BLAKE3-256 in the
    same pass. With ``crc64``, each file's CRC64NVME is computed in that pass too and put there by path."""
    workers = workers or max(2, os.cpu_count() or 2)

    def one(f: SourceFile) -> FileEntry:
        crc = Crc64Nvme() if crc64 is not None else None
        h = file_hasher(f.abspath, crypto=crypto, also=crc.update if crc is not None else None)
        if crc is not None and crc64 is not None:
            crc64[f.path] = crc.b64
        if h.size != f.size:
            raise UnsafeTreeError(f.path, f"file changed while hashing ({f.size} -> {h.size} bytes)")
        if on_bytes:
            on_bytes(h.size)
        return FileEntry(path=f.path, size=h.size, digest=h.digest(), executable=f.executable, blake3=h.crypto())

    if len(files) <= 1 or workers <= 1:
        return [one(f) for f in files]
    with ThreadPoolExecutor(max_workers=min(workers, len(files))) as pool:
        return list(pool.map(one, files))


def tree_digest(root: str | Path) -> str:
    """The digest of a directory tree (a model checkpoint): every file's path, size, digest and mode
    (xxh3-128, as build keys have always named checkpoints)."""
    return digest_json([e.model_dump(mode="json") for e in hash_tree(scan_tree(root), crypto=False)])


def tree_files(root: str | Path) -> list[SourceFile]:
    """The files of a tree (:func:`scan_tree`), or a single file as a tree of one."""
    p = Path(root)
    if p.is_dir():
        return scan_tree(p)
    st = p.stat()
    return [SourceFile(p.name, p, st.st_size, bool(st.st_mode & stat.S_IXUSR))]


def change_stamp(st: os.stat_result) -> list[int]:
    """What a write to a file changes in its stat: size, mtime_ns, inode and ctime_ns (the ctime
    moves even when the mtime is put back)."""
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]


def tree_stat(root: str | Path) -> tuple[tuple[Any, ...], ...]:
    """Every file of a tree (or a single file) by path, with its :func:`change_stamp`. A build
    compares it before and after, instead of hashing its checkpoint a second time."""
    return tuple(sorted((f.path, *change_stamp(os.stat(f.abspath))) for f in tree_files(root)))


def tree_digests(root: str | Path) -> tuple[str, str]:
    """:func:`tree_digest` and, in the same read, ``blake3:`` of the same file list with each file's
    BLAKE3 (build provenance names checkpoints and calibration sets by both). A single file is
    digested as a tree of one."""
    entries = [e.model_dump(mode="json") for e in hash_tree(tree_files(root), crypto=True)]
    plain = [{k: v for k, v in e.items() if k != "blake3"} for e in entries]
    return digest_json(plain), crypto_bytes(canonical_json(entries))
