"""A node's install directory: the engines installed there, which one is current, and what the
node remembers about them.

Layout::

    DIR/current  -> versions/<artifact hex>     (symlink, replaced atomically)
    DIR/previous -> versions/<artifact hex>     (the engine before, for instant rollback)
    DIR/versions/<artifact hex>/...             (installed engines; older ones are pruned)
    DIR/.staging-<uuid>/                        (a download in progress; removed on any failure)
    DIR/.lock                                   (one install at a time per DIR)
    DIR/.buildctl-state.json                    (the highest channel record seq installed, per channel ref)
    DIR/.buildctl-health.json                   (this node's smoke-check verdict per artifact)

``current`` only ever changes after every file's size and digest matched the manifest and the
backend's preflight load succeeded. On any failure it is untouched and staging is removed. A
quarantined artifact is refused before anything is downloaded.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Callable, Iterator

from pydantic import Field

from buildctl.core.records import Record
from buildctl.core.digest import digest_bytes, file_hasher, fsync_dir, hex_of
from buildctl.artifact_store.backends.memo import manifest_bytes
from buildctl.artifact_store.backends.store import ProgressFn, Store
from buildctl.artifact_store.channels import ChannelRecord
from buildctl.artifact_store.node.admission import VerifiedRef
from buildctl.artifact_store.node.download import download_verified
from buildctl.artifact_store.errors import (
    FileProblem,
    InstallError,
    PreflightError,
    RollbackError,
    SignatureError,
    VerificationError,
)
from buildctl.artifact_store.layout import manifest_key
from buildctl.artifact_store.trust.authority import Authority
from buildctl.artifact_store.trust.binding import check_bound
from buildctl.artifact_store.manifest import Manifest, change_stamp, file_problem, parse_manifest
from buildctl.artifact_store.quarantine import check_not_quarantined
from buildctl.artifact_store.trust.signing import TrustedKeys, manifest_signatures, verify_signature
from buildctl.artifact_store.node.admission import check_fresh
from buildctl.artifact_store.read import get_manifest_and_bytes, parse_verified_manifest
from buildctl.core.times import parse_utc

Preflight = Callable[[Manifest, Path], None]


@dataclass
class PullResult:
    artifact_id: str
    installed: bool  # False: it was already current
    path: Path
    previous: str | None
    record: ChannelRecord | None = None
    bytes: int = 0
    previous_link: str | None = None  # what DIR/previous pointed at before this install (for switch_back)


# Errors of the filesystem under DIR that are this host's, not the artifact's: InstallError.
_DEST_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.EIO,
                errno.ENOTDIR, errno.EEXIST)


def _prepare(dest: Path) -> None:
    """Create ``DIR`` and ``DIR/versions``; a destination that cannot hold them is an InstallError."""
    if dest.exists() and not dest.is_dir():
        raise InstallError(str(dest), "it is a file, not a directory")
    try:
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "versions").mkdir(exist_ok=True)
    except OSError as err:
        if err.errno not in _DEST_ERRNOS:
            raise
        raise InstallError(str(dest), f"{os.strerror(err.errno)}: {err.filename or dest}") from None


@contextmanager
def _locked(dest: Path) -> Iterator[None]:
    """One install, stage or activation at a time per ``DIR``; what a killed one left behind (a
    staging folder, a half-made link, a temporary file) is removed first."""
    try:
        fd = os.open(dest / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        if err.errno not in _DEST_ERRNOS:
            raise
        raise InstallError(str(dest), f"{os.strerror(err.errno)}: {dest / '.lock'}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _remove_leftovers(dest)
        yield
    finally:
        os.close(fd)


_LEFTOVER_LINK = re.compile(r"^\.(current|previous)-[0-9a-f]{32}$")
_LEFTOVER_TMP = re.compile(r"^\..*\.[0-9a-f]{32}\.tmp$")


def _remove_leftovers(dest: Path) -> None:
    """Under the lock: remove what an install killed mid-way left (nothing else holds the lock)."""
    for d in (dest, dest / MANIFESTS_DIR, dest / STAGED_DIR):
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for name in names:
            if d == dest and name.startswith(".staging-"):
                _make_writable(dest / name)
                shutil.rmtree(dest / name, ignore_errors=True)
            elif (d == dest and _LEFTOVER_LINK.match(name)) or _LEFTOVER_TMP.match(name):
                _unlink_quietly(d / name)


def _link_target(link: Path) -> str | None:
    try:
        return os.readlink(link)
    except OSError:
        return None


def current_artifact(dest: Path) -> str | None:
    """The artifact id installed as ``DIR/current``, if any."""
    target = _link_target(Path(dest) / "current")
    if not target or not (Path(dest) / target).is_dir():
        return None
    return "xxh3-128:" + Path(target).name


def previous_artifact(dest: Path) -> str | None:
    """The artifact id ``DIR/previous`` points at, if any."""
    target = _link_target(Path(dest) / "previous")
    if not target or not (Path(dest) / target).is_dir():
        return None
    return "xxh3-128:" + Path(target).name


def _swap_link(dest: Path, name: str, target: str) -> None:
    tmp = dest / f".{name}-{uuid.uuid4().hex}"
    os.symlink(target, tmp)
    try:
        os.replace(tmp, dest / name)
    except BaseException:
        _unlink_quietly(tmp)
        raise


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` through a temporary file beside it, removed on any failure
    (a full disk leaves the old file, never a partial one or a stray temporary)."""
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


@contextmanager
def _dest_errors(dest: Path, what: str) -> Iterator[None]:
    """An OSError of this host's disk (full, read-only, permissions) inside the block is an
    :class:`InstallError` (exit 12); any other propagates as it is."""
    try:
        yield
    except OSError as err:
        if err.errno not in _DEST_ERRNOS:
            raise
        raise InstallError(str(dest), f"{os.strerror(err.errno)} while {what} {err.filename or ''}".rstrip()) from None


def _commit_links(dest: Path, rel: str) -> tuple[str | None, str | None]:
    """Make ``current`` point at ``rel`` and ``previous`` at what ``current`` was: ``previous``
    first, then ``current``, so that an interruption between the two leaves ``current`` as it
    was (with ``previous`` equal to it, or put back) and a re-run swaps both again; never a new
    ``current`` beside a stale ``previous``. Returns what ``current`` and ``previous`` were."""
    old_target = _link_target(dest / "current")
    old_previous = _link_target(dest / "previous")
    if old_target == rel:
        return old_target, old_previous
    if old_target:
        _swap_link(dest, "previous", old_target)
    try:
        _swap_link(dest, "current", rel)
    except BaseException:
        if _link_target(dest / "current") != rel and old_target:  # current did not move: previous back
            try:
                if old_previous:
                    _swap_link(dest, "previous", old_previous)
                else:
                    os.unlink(dest / "previous")
            except OSError:
                pass  # previous equals current: still a complete engine, and a re-run swaps both again
        raise
    return old_target, old_previous


def _sync_quietly(dest: Path) -> None:
    """fsync ``dest`` after the links moved: they are in place whatever it says, so a failure is
    not reported as a failed install (the rename is atomic; only its durability is at stake)."""
    try:
        fsync_dir(dest)
    except OSError:
        pass


class InstallOptions(Record):
    """How one artifact is installed (:func:`install_artifact`): the versions kept, how its bytes
    are fetched, and what must bind its manifest's bytes."""

    keep: int = Field(2, description="installed versions to keep (current and previous at least)")
    workers: int = Field(16, description="files downloaded at once (0 or 1: one at a time)")
    range_slots: int | None = Field(None, description="ranged reads in flight over all large files (None: the "
                                    "reader's default)")
    bound: str | None = Field(None, description="the BLAKE3 of the manifest bytes the channel record signed "
                              "(the bytes must have it)")
    require_crypto: bool = Field(False, description="refuse a manifest without per-file BLAKE3, or no bound")


def install_artifact(store: Store, artifact_id: str, dest: str | Path, *, options: InstallOptions = InstallOptions(),
                     preflight: Preflight | None = None, on_bytes: ProgressFn | None = None,
                     record: ChannelRecord | None = None) -> PullResult:
    """Download, verify and atomically install one artifact as ``DIR/current``. ``options``: the
    versions kept; ``workers`` files at once, large files as parallel ranged reads, ``range_slots``
    in flight over all of them; ``bound``, the BLAKE3 of the manifest bytes the channel record
    signed (the bytes must have it); ``require_crypto``: refuse a manifest without per-file BLAKE3,
    or no ``bound`` (the engine already current is checked too, from the manifest bytes kept beside
    it). ``record``: the channel record installed, whose seq this node remembers
    (:func:`record_installed`) before ``current`` moves. A full or read-only disk anywhere before
    the swap is an :class:`InstallError` (exit 12) with ``current`` as it was."""
    dest = Path(dest)
    _prepare(dest)
    with _locked(dest), _dest_errors(dest, "writing"):
        return _install_locked(store, artifact_id, dest, options=options, preflight=preflight, on_bytes=on_bytes,
                               record=record)


def _install_locked(store: Store, artifact_id: str, dest: Path, *, options: InstallOptions,
                    preflight: Preflight | None, on_bytes: ProgressFn | None,
                    record: ChannelRecord | None) -> PullResult:
    bound, require_crypto = options.bound, options.require_crypto
    previous = current_artifact(dest)
    final = dest / "versions" / hex_of(artifact_id)
    if previous == artifact_id:
        if bound is not None or require_crypto:
            body = _kept_manifest(dest, artifact_id)
            if body is None:
                body = get_manifest_and_bytes(store, artifact_id)[1]
            check_bound(artifact_id, body, parse_manifest(body, f"kept manifest of {artifact_id}"), bound,
                        require_crypto=require_crypto)
        if record is not None:
            record_installed(dest, record)
        return PullResult(artifact_id, installed=False, path=final, previous=previous)
    check_not_quarantined(store, artifact_id, "not installing it; the current engine stays")
    manifest, body = get_manifest_and_bytes(store, artifact_id)
    check_bound(artifact_id, body, manifest, bound, require_crypto=require_crypto)
    _download_version(store, artifact_id, manifest, dest, final, preflight=preflight, options=options,
                      on_bytes=on_bytes)
    # What the node remembers is written before current moves: a full disk stops the install here.
    _keep_manifest(dest, artifact_id, body)
    if record is not None:
        record_installed(dest, record)
    _, old_previous = _commit_links(dest, os.path.join("versions", final.name))
    _sync_quietly(dest)
    _prune_quietly(dest, options.keep)
    return PullResult(artifact_id, installed=True, path=final, previous=previous, bytes=manifest.total_size,
                      previous_link=old_previous)


def _download_version(store: Store, artifact_id: str, manifest: Manifest, dest: Path, final: Path, *,
                      preflight: Preflight | None, options: InstallOptions, on_bytes: ProgressFn | None = None) -> None:
    """Download and verify the artifact into a staging folder of ``dest`` (and with ``preflight``,
    load it there), then rename it to ``final`` in ``versions/``, replacing an older copy of the
    same artifact (e.g. ``previous``); the staging folder is removed on any failure."""
    staging = dest / f".staging-{uuid.uuid4().hex}"
    staging.mkdir()
    try:
        _verified_and_loaded(artifact_id, manifest, staging, preflight,
                             download_verified(store, manifest, staging, workers=options.workers,
                                               range_slots=options.range_slots, on_bytes=on_bytes))
        if final.exists():
            _make_writable(final)
            shutil.rmtree(final)
        os.rename(staging, final)
        fsync_dir(final.parent)
    except BaseException:
        _make_writable(staging)
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _verified_and_loaded(artifact_id: str, manifest: Manifest, root: Path, preflight: Preflight | None,
                         problems: list[FileProblem]) -> None:
    """Refuse ``root`` unless its bytes matched (``problems`` empty) and, with ``preflight``, the
    backend loads it: the two checks before ``current`` may move, for a pull and an activation."""
    if problems:
        raise VerificationError(artifact_id, problems)
    if preflight is not None:
        try:
            preflight(manifest, root)
        except Exception as err:  # any failure to load means: do not install
            raise PreflightError(artifact_id, f"{type(err).__name__}: {err}") from None


def switch_back(dest: str | Path, result: PullResult) -> str | None:
    """Undo an install whose engine failed on this node: ``current`` goes back to the engine it
    replaced, and ``previous`` to what it was before when that is still on disk (``keep`` of 3 or
    more keeps it; with 2 it was pruned and ``previous`` is removed); returns the artifact now current (None: there
    was nothing before, and ``current`` is removed so nothing serves the failed engine)."""
    dest = Path(dest)
    with _locked(dest):
        if _link_target(dest / "current") != os.path.join("versions", hex_of(result.artifact_id)):
            return current_artifact(dest)  # something else was installed meanwhile: leave it
        if result.previous is None:
            os.unlink(dest / "current")
            fsync_dir(dest)
            return None
        _swap_link(dest, "current", os.path.join("versions", hex_of(result.previous)))
        if result.previous_link and (dest / result.previous_link).is_dir():
            _swap_link(dest, "previous", result.previous_link)
        else:
            os.unlink(dest / "previous")
        fsync_dir(dest)
        return result.previous


def _make_writable(path: Path) -> None:
    if not path.exists():
        return
    for root, dirs, files in os.walk(path):
        os.chmod(root, 0o755)
        for f in files:
            try:
                os.chmod(os.path.join(root, f), 0o644)
            except OSError:
                pass


MANIFESTS_DIR = ".buildctl-manifests"


def _keep_manifest(dest: Path, artifact_id: str, body: bytes) -> None:
    """Keep the manifest's bytes beside ``versions/`` (not in the engine's own directory, which
    holds exactly the manifest's files): ``repair``/``heal --from DIR`` restore a rotted store
    manifest from them, and the id proves them."""
    d = dest / MANIFESTS_DIR
    d.mkdir(exist_ok=True)
    write_atomic(d / f"{hex_of(artifact_id)}.json", body)


def _kept_manifest(dest: Path, artifact_id: str) -> bytes | None:
    """The kept manifest bytes of an installed engine, when they are there and hash to its id."""
    try:
        body = (dest / MANIFESTS_DIR / f"{hex_of(artifact_id)}.json").read_bytes()
    except OSError:
        return None
    return body if digest_bytes(body) == artifact_id else None


def installed_manifests(dest: str | Path) -> Iterator[bytes]:
    """The manifest bytes kept for the engines in ``dest/versions/`` (unverified: the caller
    checks each against the id it wants)."""
    for f in sorted((Path(dest) / MANIFESTS_DIR).glob("*.json")):
        try:
            yield f.read_bytes()
        except OSError:
            continue


def _prune_quietly(dest: Path, keep: int) -> None:
    """Prune after the swap: a disk error here leaves an extra version, never a failed install."""
    try:
        _prune(dest, keep)
    except OSError:
        pass


def _prune(dest: Path, keep: int) -> None:
    keep_names = {Path(t).name for t in (_link_target(dest / "current"), _link_target(dest / "previous")) if t}
    keep_names |= {e.path_name for e in staged_engines(dest)}  # staged for an upgrade: kept until activated
    versions = sorted((dest / "versions").iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
    kept = 0
    for v in versions:
        if v.name in keep_names or kept < keep - len(keep_names):
            kept += v.name not in keep_names
            continue
        _make_writable(v)
        shutil.rmtree(v, ignore_errors=True)
    for f in (dest / MANIFESTS_DIR).glob("*.json"):  # the copies of pruned engines go with them
        if not (dest / "versions" / f.name[:-len(".json")]).is_dir():
            f.unlink(missing_ok=True)


STATE_FILE = ".buildctl-state.json"


def installed_seqs(dest: Path) -> dict[str, int]:
    """The highest channel record sequence installed here, per profile/channel/compat key."""
    try:
        data = json.loads((Path(dest) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): int(v) for k, v in data.items()} if isinstance(data, dict) else {}


def channel_ref(record: ChannelRecord) -> str:
    """The key of a channel ref in the state file: profile/channel/compat key."""
    return f"{record.profile}/{record.channel}/{record.compat_key}"


def record_installed(dest: Path, record: ChannelRecord) -> None:
    """Remember that this node installed ``record`` (its seq is the floor for later records)."""
    state = installed_seqs(dest)
    k = channel_ref(record)
    state[k] = max(state.get(k, 0), record.seq)
    write_atomic(Path(dest) / STATE_FILE, json.dumps(state, sort_keys=True).encode())


TRUST_FILE = ".buildctl-trusted.json"


def verified_refs(dest: Path) -> dict[str, VerifiedRef]:
    """What this node's last full trust check of each channel ref covered (``check_trust``'s
    proof); an unreadable file is no proof (the next pull checks everything again)."""
    try:
        data = json.loads((Path(dest) / TRUST_FILE).read_text())
        return {str(k): VerifiedRef.model_validate(v) for k, v in data.items()}
    except (OSError, ValueError, AttributeError):
        return {}


def record_verified(dest: Path, proof: VerifiedRef) -> None:
    """Keep ``proof`` for ``proof.ref`` once what it covered is installed here."""
    refs = verified_refs(dest)
    refs[proof.ref] = proof
    write_atomic(Path(dest) / TRUST_FILE,
                  json.dumps({k: v.model_dump(mode="json") for k, v in refs.items()}, sort_keys=True).encode())


HEALTH_FILE = ".buildctl-health.json"


def health_marks(dest: str | Path) -> dict[str, dict[str, str]]:
    """This node's own smoke-check verdicts by artifact id: ``{"status", "when", "detail"}``."""
    try:
        data = json.loads((Path(dest) / HEALTH_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}


def mark_health(dest: str | Path, artifact_id: str, status: str, when: str, detail: str | None = None) -> None:
    """Record this node's smoke-check verdict for an artifact (atomically replaced)."""
    marks = health_marks(dest)
    marks[artifact_id] = {"status": status, "when": when, "detail": detail or ""}
    write_atomic(Path(dest) / HEALTH_FILE, json.dumps(marks, sort_keys=True).encode())


# --- staged engines: downloaded before an upgrade, activated after it, offline ------------------

STAGED_DIR = ".buildctl-staged"


@dataclass
class StagedEngine:
    """An engine downloaded and verified into ``versions/`` ahead of an upgrade, with what
    activation checks offline: the channel record, the manifest's bytes and signatures, and when
    every file last re-hashed right."""

    artifact_id: str
    compat_key: str
    record: ChannelRecord
    manifest_body: bytes
    manifest_signatures: list[dict]
    verified_at: str
    staged_at: str
    stats: dict[str, list[int]] | None = None  # per file at the deep verify: size, mtime_ns, inode, ctime_ns

    @property
    def path_name(self) -> str:
        return hex_of(self.artifact_id)

    def to_json(self) -> dict:
        return {"artifact_id": self.artifact_id, "compat_key": self.compat_key, "profile": self.record.profile,
                "channel": self.record.channel, "seq": self.record.seq, "verified_at": self.verified_at,
                "staged_at": self.staged_at}


def _staged_file(dest: Path, record: ChannelRecord) -> Path:
    name = f"{record.profile}--{record.channel}--{record.compat_key}.json"
    return Path(dest) / STAGED_DIR / name


def staged_engines(dest: str | Path) -> list[StagedEngine]:
    """Every engine staged in ``dest``, unreadable entries skipped (they are re-staged)."""
    out = []
    for f in sorted((Path(dest) / STAGED_DIR).glob("*.json")):
        try:
            d = json.loads(f.read_text())
            stats = d.get("stats")
            out.append(StagedEngine(d["artifact_id"], d["compat_key"], ChannelRecord.model_validate(d["record"]),
                                    d["manifest"].encode(), list(d.get("manifest_signatures") or []), d["verified_at"],
                                    d["staged_at"],
                                    {str(k): [int(x) for x in v] for k, v in stats.items()} if isinstance(stats, dict) else None))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return out


def stage_artifact(store: Store, record: ChannelRecord, artifact_id: str, dest: str | Path, *, when: str,
                   workers: int = 16, on_bytes: ProgressFn | None = None,
                   require_crypto: bool = False) -> tuple[StagedEngine, bool]:
    """Download and verify ``artifact_id`` into ``DIR/versions/`` without touching ``current``,
    and record what activation needs offline. Returns the entry and whether bytes were downloaded
    (an engine already in ``versions/`` is re-hashed instead). The manifest bytes must be the ones
    ``record`` binds (:func:`~buildctl.artifact_store.trust.binding.check_bound`)."""
    dest = Path(dest)
    _prepare(dest)
    with _locked(dest), _dest_errors(dest, "staging"):
        return _stage_locked(store, record, artifact_id, dest, when=when, workers=workers, on_bytes=on_bytes,
                             require_crypto=require_crypto)


def _stage_locked(store: Store, record: ChannelRecord, artifact_id: str, dest: Path, *, when: str, workers: int,
                  on_bytes: ProgressFn | None, require_crypto: bool) -> tuple[StagedEngine, bool]:
    check_not_quarantined(store, artifact_id, "not staging it")
    body = manifest_bytes(store, artifact_id)
    manifest = parse_verified_manifest(body, artifact_id, manifest_key(artifact_id))
    check_bound(artifact_id, body, manifest, record.bound(artifact_id), require_crypto=require_crypto)
    sigs = manifest_signatures(store, artifact_id)[0]
    final = dest / "versions" / hex_of(artifact_id)
    # already here (installed before, or staged) and re-hashed just now: nothing to download
    downloaded = not (final.is_dir() and not local_problems(manifest, final))
    if downloaded:
        _download_version(store, artifact_id, manifest, dest, final, preflight=None,
                          options=InstallOptions(workers=workers), on_bytes=on_bytes)
    stats = file_stats(manifest, final)
    entry = StagedEngine(artifact_id, record.compat_key, record, body, sigs, when, when, stats)
    f = _staged_file(dest, record)
    f.parent.mkdir(exist_ok=True)
    write_atomic(f, json.dumps({"artifact_id": artifact_id, "compat_key": record.compat_key,
                                 "record": json.loads(record.to_bytes()), "manifest": body.decode(),
                                 "manifest_signatures": sigs, "verified_at": when, "staged_at": when,
                                 "stats": stats}, sort_keys=True).encode())
    fsync_dir(f.parent)
    return entry, downloaded


def file_stats(manifest: Manifest, root: Path) -> dict[str, list[int]]:
    """Each manifest file's size, mtime_ns, inode and ctime_ns under ``root``, taken right after its
    bytes were verified: a later write changes the ctime even when the mtime is put back."""
    return {e.path: change_stamp(os.lstat(root / e.path)) for e in manifest.files}


def tree_problems(manifest: Manifest, root: Path) -> list[FileProblem]:
    """What ``root`` holds beside, or instead of, the manifest's files, by ``lstat`` alone (no
    link is followed): an extra file or folder, a symlink, a special file, a missing file, a size
    that differs. The tree must be exactly the manifest's files (and the folders that hold them)."""
    want = {e.path: e for e in manifest.files}
    folders = {str(Path(p).parent) for p in want} | {"."}
    folders |= {str(parent) for p in want for parent in Path(p).parents}
    problems: list[FileProblem] = []
    seen: set[str] = set()

    def walk(d: Path, rel: str) -> None:
        try:
            entries = list(os.scandir(d))
        except OSError as err:
            problems.append(FileProblem(rel, "unreadable", actual=err.strerror))
            return
        for ent in sorted(entries, key=lambda x: x.name):
            r = ent.name if rel == "." else f"{rel}/{ent.name}"
            if ent.is_symlink():
                problems.append(FileProblem(r, "symlink", actual=os.readlink(ent.path)))
            elif ent.is_dir(follow_symlinks=False):
                if r in folders:
                    walk(Path(ent.path), r)
                else:
                    problems.append(FileProblem(r, "extra", actual="a folder not in the manifest"))
            elif not ent.is_file(follow_symlinks=False):
                problems.append(FileProblem(r, "extra", actual="not a regular file"))
            elif r not in want:
                problems.append(FileProblem(r, "extra", actual="not in the manifest"))
            else:
                seen.add(r)
                size = ent.stat(follow_symlinks=False).st_size
                if size != want[r].size:
                    problems.append(FileProblem(r, "size", want[r].size, size))

    if root.is_symlink() or not root.is_dir():
        return [FileProblem(".", "missing" if not root.is_symlink() else "symlink")]
    walk(root, ".")
    problems += [FileProblem(p, "missing") for p in sorted(set(want) - seen)
                 if not any(q.path == p or p.startswith(q.path + "/") for q in problems)]
    return problems


def local_problems(manifest: Manifest, root: Path, *, unchanged: dict[str, list[int]] | None = None) -> list[FileProblem]:
    """Every file of ``root`` that does not match the manifest: the tree's shape by ``lstat``
    (:func:`tree_problems`), then each file's bytes re-hashed, except those whose size, mtime,
    inode and ctime still equal ``unchanged`` (their stat at a deep verify inside the window)."""
    problems = tree_problems(manifest, root)
    if problems:
        return problems
    for e in manifest.files:
        p = root / e.path
        if unchanged is not None and unchanged.get(e.path) == change_stamp(os.lstat(p)):
            continue
        if problem := file_problem(e, p):
            problems.append(problem)
    return problems


def activate_staged(dest: str | Path, entry: StagedEngine, *, auth: Authority, now: datetime,
                    preflight: Preflight | None = None) -> PullResult:
    """Swap ``current`` to a staged engine, reading nothing from the store: the staged manifest
    must hash to the artifact id and, with the authority's ``trusted`` keys, carry a trusted
    builder signature under a record signed by a trusted promoter key (revocations are those the keys file holds);
    the record must be fresh. The staged tree must be exactly the manifest's files (no extra,
    missing or linked entry, every size equal: :func:`tree_problems`); a file is re-hashed when its
    stat changed since the staging's deep verify, and every file when that verify is older than
    the authority's ``verify_window_s``; its ``require_crypto`` refuses an engine bound by
    xxh3-128 only. Then ``preflight`` loads it, and only then does ``current`` move. The
    staged entry is removed once it is current."""
    dest = Path(dest)
    aid = entry.artifact_id
    manifest = parse_verified_manifest(entry.manifest_body, aid, f"staged manifest of {aid}")
    check_bound(aid, entry.manifest_body, manifest, entry.record.bound(aid), require_crypto=auth.require_crypto)
    check_fresh(entry.record)
    trusted, verify_window_s = auth.trusted, auth.verify_window_s
    if trusted is not None:
        verify_signature(f"channel record {entry.record.channel} #{entry.record.seq}", entry.record.signed_bytes(),
                         entry.record.signature, trusted, "promoter", signed_at=entry.record.when)
        _verify_staged_manifest(entry, trusted, manifest.created_at)
        seen = installed_seqs(dest).get(channel_ref(entry.record), 0)
        if entry.record.seq < seen:
            raise RollbackError(entry.record.channel, entry.record.seq, seen)
    final = dest / "versions" / entry.path_name
    with _locked(dest):
        fresh = (now - parse_utc(entry.verified_at)).total_seconds() <= verify_window_s
        _verified_and_loaded(aid, manifest, final, preflight,
                             local_problems(manifest, final, unchanged=entry.stats if fresh else None))
        previous = current_artifact(dest)
        with _dest_errors(dest, "activating"):
            # What the node remembers is written before current moves: a full disk stops it here.
            _keep_manifest(dest, aid, entry.manifest_body)
            record_installed(dest, entry.record)
            _, old_previous = _commit_links(dest, os.path.join("versions", final.name))
        _sync_quietly(dest)
        _unlink_quietly(_staged_file(dest, entry.record))  # a leftover entry activates as 'already current'
        return PullResult(aid, installed=previous != aid, path=final, previous=previous, record=entry.record,
                          bytes=manifest.total_size, previous_link=old_previous)


def _verify_staged_manifest(entry: StagedEngine, trusted: TrustedKeys, created_at: str) -> str:
    if not entry.manifest_signatures:
        raise SignatureError(f"manifest {entry.artifact_id}", "unsigned")
    last: SignatureError | None = None
    for sig in entry.manifest_signatures:
        try:
            return verify_signature(f"manifest {entry.artifact_id}", entry.manifest_body, sig, trusted, "builder",
                                    signed_at=created_at)
        except SignatureError as err:
            last = err
    raise last  # type: ignore[misc]
