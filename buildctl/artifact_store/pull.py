"""Install an artifact on a node: download, verify while downloading, preflight, swap atomically.

Layout under the destination directory::

    DIR/current  -> versions/<artifact hex>     (symlink, replaced atomically)
    DIR/previous -> versions/<artifact hex>     (the engine before, for instant rollback)
    DIR/versions/<artifact hex>/...             (installed engines; older ones are pruned)
    DIR/.staging-<uuid>/                        (a download in progress; removed on any failure)
    DIR/.lock                                   (one pull at a time per DIR)

``current`` only ever changes after every file's size and digest matched the manifest and the
backend's preflight load succeeded. On any failure it is untouched and staging is removed. A
quarantined artifact is refused before anything is downloaded, even when a channel points at it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from buildctl.digest import BUFFER_SIZE, Hasher, fsync_dir, hex_of, write_all
from buildctl.artifact_store.errors import (
    ChannelNotFoundError,
    ExpiredRecordError,
    FileProblem,
    InstallError,
    KeyNotFoundError,
    PreflightError,
    RollbackError,
    SignatureError,
    StaleRecordError,
    VerificationError,
)
from buildctl.artifact_store.manifest import FileEntry, Manifest
from buildctl.artifact_store.backend import ProgressFn, Store
from buildctl.artifact_store.channels import ChannelRecord, history, read_channel
from buildctl.artifact_store.layout import blob_key
from buildctl.artifact_store.quarantine import check_not_quarantined
from buildctl.artifact_store.ranged import RangedReader, ShortRangeError
from buildctl.artifact_store.revocation import with_revocations
from buildctl.artifact_store.signing import TrustedKeys, verify_manifest_signature, verify_signature
from buildctl.artifact_store.verify import get_manifest

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


def resolve_channel(store: Store, profile: str, channel: str, compat_keys: list[str]) -> ChannelRecord:
    """The channel record for the first compat key that has one."""
    for key in compat_keys:
        got = read_channel(store, profile, channel, key)
        if got is not None:
            return got[0]
    raise ChannelNotFoundError(profile, channel, compat_keys)


@contextmanager
def _locked(dest: Path) -> Iterator[None]:
    fd = os.open(dest / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


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
    os.replace(tmp, dest / name)


def _download_ranged(store: Store, entry: FileEntry, target: Path, on_bytes: ProgressFn | None,
                     ranged: RangedReader) -> FileProblem | None:
    """A large blob: parallel ranged reads written at their offsets, hashed in order as they arrive."""
    key = blob_key(entry.digest)
    size = store.stat(key)
    if size is None:
        return FileProblem(entry.path, "missing", actual=f"blob {key} does not exist")
    if size != entry.size:
        return FileProblem(entry.path, "size", entry.size, size)
    try:
        h = ranged.download(key, size, target, on_bytes=on_bytes)
    except KeyNotFoundError:
        return FileProblem(entry.path, "missing", actual=f"blob {key} disappeared during the download")
    except ShortRangeError as err:
        return FileProblem(entry.path, "size", entry.size, err.offset + err.got)
    if h.digest() != entry.digest:
        return FileProblem(entry.path, "digest", entry.digest, h.digest())
    os.chmod(target, 0o555 if entry.executable else 0o444)
    return None


def _download(store: Store, entry: FileEntry, target: Path, on_bytes: ProgressFn | None,
              ranged: RangedReader | None = None) -> FileProblem | None:
    """Download one blob into ``target`` while hashing it; report what is wrong, or None. Blobs
    ``ranged`` applies to are read as ranges; others stream."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if ranged is not None and ranged.applies(entry.size):
        return _download_ranged(store, entry, target, on_bytes, ranged)
    h = Hasher()
    buf = bytearray(min(BUFFER_SIZE, max(64 * 1024, entry.size + 1)))  # small files: small buffers, many at once
    view = memoryview(buf)
    try:
        with store.open_read(blob_key(entry.digest)) as src, open(target, "xb", buffering=0) as dst:
            while True:
                n = src.readinto(buf)
                if not n:
                    break
                h.update(view[:n])
                write_all(dst, view[:n])
                if on_bytes:
                    on_bytes(n)
                if h.size > entry.size:
                    return FileProblem(entry.path, "size", entry.size, f">{entry.size}")
            os.fsync(dst.fileno())
    except KeyNotFoundError:
        return FileProblem(entry.path, "missing", actual=f"blob {blob_key(entry.digest)} does not exist")
    if h.size != entry.size:
        return FileProblem(entry.path, "size", entry.size, h.size)
    if h.digest() != entry.digest:
        return FileProblem(entry.path, "digest", entry.digest, h.digest())
    os.chmod(target, 0o555 if entry.executable else 0o444)
    return None


def install_artifact(
    store: Store,
    artifact_id: str,
    dest: str | Path,
    *,
    preflight: Preflight | None = None,
    keep: int = 2,
    workers: int = 16,
    range_slots: int | None = None,
    on_bytes: ProgressFn | None = None,
) -> PullResult:
    """Download, verify and atomically install one artifact as ``DIR/current``. ``workers`` files
    at once; large files as parallel ranged reads, ``range_slots`` in flight over all of them."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "versions").mkdir(exist_ok=True)
    with _locked(dest):
        previous = current_artifact(dest)
        final = dest / "versions" / hex_of(artifact_id)
        if previous == artifact_id:
            return PullResult(artifact_id, installed=False, path=final, previous=previous)
        for stale in dest.glob(".staging-*"):  # left by a crashed pull
            shutil.rmtree(stale, ignore_errors=True)
        check_not_quarantined(store, artifact_id, "not installing it; the current engine stays")
        manifest = get_manifest(store, artifact_id)
        staging = dest / f".staging-{uuid.uuid4().hex}"
        staging.mkdir()
        try:
            try:
                with RangedReader(store, slots=range_slots) as ranged, ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
                    problems = [p for p in pool.map(lambda e: _download(store, e, staging / e.path, on_bytes, ranged),
                                                    manifest.files) if p]
            except OSError as err:
                if err.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EACCES, errno.EROFS, errno.EIO):
                    raise InstallError(str(dest), f"{os.strerror(err.errno)} while writing {err.filename or 'staging'}") from None
                raise
            if problems:
                raise VerificationError(artifact_id, problems)
            if preflight is not None:
                try:
                    preflight(manifest, staging)
                except Exception as err:  # any failure to load means: do not install
                    raise PreflightError(artifact_id, f"{type(err).__name__}: {err}") from None
            if final.exists():  # an older install of the same artifact (e.g. 'previous'): replace it
                _make_writable(final)
                shutil.rmtree(final)
            os.rename(staging, final)
            fsync_dir(final.parent)
        except BaseException:
            _make_writable(staging)
            shutil.rmtree(staging, ignore_errors=True)
            raise
        rel = os.path.join("versions", final.name)
        old_target = _link_target(dest / "current")
        old_previous = _link_target(dest / "previous")
        _swap_link(dest, "current", rel)
        if old_target and old_target != rel:
            _swap_link(dest, "previous", old_target)
        fsync_dir(dest)
        _prune(dest, keep)
        return PullResult(artifact_id, installed=True, path=final, previous=previous, bytes=manifest.total_size,
                          previous_link=old_previous)


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


def _prune(dest: Path, keep: int) -> None:
    keep_names = {Path(t).name for t in (_link_target(dest / "current"), _link_target(dest / "previous")) if t}
    versions = sorted((dest / "versions").iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
    kept = 0
    for v in versions:
        if v.name in keep_names or kept < keep - len(keep_names):
            kept += v.name not in keep_names
            continue
        _make_writable(v)
        shutil.rmtree(v, ignore_errors=True)


STATE_FILE = ".buildctl-state.json"


def installed_seqs(dest: Path) -> dict[str, int]:
    """The highest channel record sequence installed here, per profile/channel/compat key."""
    try:
        data = json.loads((Path(dest) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): int(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _record_installed(dest: Path, record: ChannelRecord) -> None:
    state = installed_seqs(dest)
    k = f"{record.profile}/{record.channel}/{record.compat_key}"
    state[k] = max(state.get(k, 0), record.seq)
    tmp = Path(dest) / f".{STATE_FILE}.{uuid.uuid4().hex}"
    tmp.write_text(json.dumps(state, sort_keys=True))
    os.replace(tmp, Path(dest) / STATE_FILE)


def check_fresh(record: ChannelRecord, min_seq: int = 0) -> None:
    """Refuse a record below this node's provisioned floor, or past its expiry (keys or not)."""
    if record.seq < min_seq:  # the floor provisioning pinned for this node (--min-seq)
        raise StaleRecordError(record.channel, record.seq, min_seq, "this node's --min-seq")
    if record.expired():
        raise ExpiredRecordError(record.channel, record.seq, str(record.expires))


def check_trust(store: Store, record: ChannelRecord, dest: Path, trusted: TrustedKeys,
                artifact_id: str | None = None) -> None:
    """With trusted keys: the channel record must be signed by a trusted promoter key and the
    manifest of ``artifact_id`` (default: the record's) by a trusted builder key, neither revoked
    at the time of the record; and the record must not be older than what this node installed
    (rollback protection) nor than the channel's newest signed history record."""
    trusted = with_revocations(store, trusted)
    verify_signature(f"channel record {record.channel} #{record.seq}", record.signed_bytes(), record.signature, trusted,
                     "promoter", signed_at=record.when)
    k = trusted.threshold(record.channel)
    if k > 1:
        have = record.signers(trusted)
        if len(have) < k and not (record.action != "promote"
                                  and approved_before(store, record, artifact_id or record.artifact_id, trusted, k)):
            raise SignatureError(f"channel record {record.channel} #{record.seq}",
                                 f"{len(have)} of the {k} promoter signatures the channel requires")
    verify_manifest_signature(store, artifact_id or record.artifact_id, trusted)
    seen = installed_seqs(dest).get(f"{record.profile}/{record.channel}/{record.compat_key}", 0)
    if record.seq < seen:
        raise RollbackError(record.channel, record.seq, seen)
    # A node that has installed nothing yet has no 'seen': the channel's create-only history
    # (Object Lock in production) is the witness. A validly signed history record newer than the
    # ref means the ref was replayed or frozen.
    newest = newest_signed_seq(store, record, trusted)
    if newest > record.seq:
        raise StaleRecordError(record.channel, record.seq, newest, "the channel's signed history")


def approved_before(store: Store, record: ChannelRecord, artifact_id: str, trusted: TrustedKeys, k: int) -> bool:
    """Whether an earlier history record with ``k`` promoter signatures moved the channel to
    ``artifact_id``: a rollback, a rollout step or a re-sign may then carry one signature (it
    chooses among artifacts the channel's quorum already approved)."""
    return any(r.seq < record.seq and (r.artifact_id == artifact_id or (r.rollout and r.rollout.target == artifact_id))
               and len(r.signers(trusted)) >= k
               for r in history(store, record.profile, record.channel, record.compat_key))


def newest_signed_seq(store: Store, record: ChannelRecord, trusted: TrustedKeys) -> int:
    """The highest sequence among the channel's history records signed by a trusted promoter key (0: none)."""
    for rec in reversed(history(store, record.profile, record.channel, record.compat_key)):
        try:
            verify_signature(f"channel record {rec.channel} #{rec.seq}", rec.signed_bytes(), rec.signature, trusted,
                             "promoter", signed_at=rec.when)
        except SignatureError:
            continue  # an unsigned or forged history entry proves nothing
        return rec.seq
    return 0


def pull(
    store: Store,
    profile: str,
    channel: str,
    dest: str | Path,
    compat_keys: list[str],
    *,
    preflight: Preflight | None = None,
    keep: int = 2,
    on_bytes: ProgressFn | None = None,
    trusted: TrustedKeys | None = None,
    min_seq: int = 0,
    node_id: str | None = None,
    record: ChannelRecord | None = None,
) -> PullResult:
    """Resolve the channel for this host's compat keys and install its artifact. With ``trusted``
    keys (the CLI loads them from ``BUILDCTL_TRUSTED_KEYS``), signatures and rollback protection
    are enforced, and a ref older than the newest signed history record is refused; a record
    below ``min_seq`` and an expired record are refused always. During a rollout the record gives
    ``node_id`` the new artifact or the old one by its wave bucket (no id: the old one).
    ``record``: the one already resolved (its refusals are still checked here)."""
    record = record or resolve_channel(store, profile, channel, compat_keys)
    dest = Path(dest)
    check_fresh(record, min_seq)
    artifact_id = record.artifact_for(node_id)
    if trusted is not None:
        dest.mkdir(parents=True, exist_ok=True)
        check_trust(store, record, dest, trusted, artifact_id)
    result = install_artifact(store, artifact_id, dest, preflight=preflight, keep=keep, on_bytes=on_bytes)
    result.record = record
    _record_installed(dest, record)
    return result


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
    tmp = Path(dest) / f".{HEALTH_FILE}.{uuid.uuid4().hex}"
    tmp.write_text(json.dumps(marks, sort_keys=True))
    os.replace(tmp, Path(dest) / HEALTH_FILE)
