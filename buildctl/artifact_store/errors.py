"""Errors of the ``artifact_store`` package."""

from __future__ import annotations

from dataclasses import dataclass

from buildctl.core.errors import (
    BadInputError,
    BuildctlError,
    ConflictError,
    DestinationError,
    GateRefusedError,
    IntegrityError,
    NotFoundError,
    PreflightRefusedError,
    UnavailableError,
)


class StoreUriError(BadInputError):
    """A store URI that names no supported backend."""

    def __init__(self, uri: str, why: str) -> None:
        self.uri = uri
        super().__init__(f"store {uri!r}: {why}")


class StoreUnavailableError(UnavailableError):
    """The store cannot be reached or refused the request for a reason other than a conflict;
    ``detail`` is a one-line cause (missing or refused credentials, an unreachable endpoint)."""

    def __init__(self, uri: str, detail: str) -> None:
        self.uri = uri
        self.detail = detail
        super().__init__(f"store {uri}: {detail}")


class KeyNotFoundError(NotFoundError):
    """A store key does not exist."""

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"no such key in store: {key}")


class UnsafeTreeError(BadInputError):
    """A source tree entry that cannot go into a manifest (path rule, symlink, special file, empty dir)."""

    def __init__(self, entry: str, why: str) -> None:
        self.entry = entry
        self.why = why
        super().__init__(f"refusing {entry!r}: {why}")


class ManifestError(BadInputError):
    """A manifest that does not parse, validate, or has an unknown schema version."""

    def __init__(self, source: str, detail: str) -> None:
        self.source = source
        self.detail = detail
        super().__init__(f"{source}: invalid manifest: {detail}")


class ArtifactNotFoundError(NotFoundError):
    """No manifest exists for an artifact id (or prefix)."""

    def __init__(self, artifact: str, detail: str = "") -> None:
        self.artifact = artifact
        super().__init__(f"artifact {artifact} not found" + (f": {detail}" if detail else ""))


class ProvenanceNotFoundError(NotFoundError):
    """An artifact has no build provenance (it was imported, or built before provenance)."""

    def __init__(self, artifact: str) -> None:
        self.artifact = artifact
        super().__init__(f"artifact {artifact} has no build provenance: only `buildctl build` writes one (imported and "
                         "pre-provenance artifacts have none)")


class ChannelNotFoundError(NotFoundError):
    """A channel has no ref for the requested profile and compat key(s). ``unknown``: which name
    is wrong when it is not the fingerprint (the store, the profile or the channel), and the known
    ones; ``None`` for a real miss of this host's compat keys."""

    def __init__(self, profile: str, channel: str, compat_keys: list[str], unknown: str | None = None) -> None:
        self.profile = profile
        self.channel = channel
        self.compat_keys = list(compat_keys)
        self.unknown = unknown
        super().__init__(unknown if unknown is not None else (
            f"channel {channel!r} of profile {profile!r} has no engine for this fingerprint "
            f"(compat keys tried: {', '.join(compat_keys)})"))


class HistoryConflictError(IntegrityError):
    """A channel's history slot holds a record this writer did not write: another principal wrote
    it first (the history is create-only). ``moved``: whether the ref had already moved."""

    def __init__(self, key: str, moved: bool) -> None:
        self.key = key
        self.moved = moved
        if moved:
            msg = (f"history record {key} holds another principal's record: the ref moved, but its own history "
                   "record could not be written there; `buildctl history` marks the stranger and `buildctl scrub` "
                   "reports it (remove it with the repair role, then re-run to write the record)")
        else:
            msg = (f"history record {key} already exists before the ref reached it: written by another principal; "
                   "not moving the ref (`buildctl history` marks it; remove it with the repair role after looking at it)")
        super().__init__(msg)


class StoreNotFoundError(NotFoundError):
    """The store named does not exist (a local folder that is not there, an S3 bucket that is not)."""

    def __init__(self, uri: str, where: str | None = None) -> None:
        self.uri = uri
        hint = (f"{where}; check --store / BUILDCTL_STORE and BUILDCTL_ENDPOINT_URL" if where else
                "check --store / BUILDCTL_STORE; commands that write an artifact create a local store")
        super().__init__(f"store {uri} does not exist ({hint})")


class UnknownChannelError(BadInputError):
    """A channel name outside the configured set and not yet in the store (a typo, most likely)."""

    def __init__(self, channel: str, known: list[str]) -> None:
        self.channel = channel
        super().__init__(f"unknown channel {channel!r}: known channels are {', '.join(known)} (BUILDCTL_CHANNELS); "
                         "pass --new-channel to create it")


@dataclass(frozen=True)
class FileProblem:
    """One bad file: which, what is wrong (missing, size, digest, blake3, extra, unreadable), expected vs
    actual. ``blake3``: the xxh3-128 digest matched and the BLAKE3-256 one did not (other bytes
    built to collide)."""

    path: str
    kind: str
    expected: str | int | None = None
    actual: str | int | None = None

    def render(self) -> str:
        if self.kind in ("size", "digest", "blake3"):
            return f"{self.path}: {self.kind} mismatch (expected {self.expected}, got {self.actual})"
        return f"{self.path}: {self.kind}" + (f" ({self.actual})" if self.actual is not None else "")


class VerificationError(IntegrityError):
    """Bytes do not match the manifest. ``problems`` lists every bad file; ``quarantine_key`` names
    the quarantine record written on detection, when the caller could write one."""

    def __init__(self, artifact: str, problems: list[FileProblem], quarantine_key: str | None = None) -> None:
        self.artifact = artifact
        self.problems = list(problems)
        self.quarantine_key = quarantine_key
        lines = [f"artifact {artifact} failed verification ({len(problems)} problem(s))"]
        lines += [f"  {p.render()}" for p in problems]
        if quarantine_key:
            lines.append(f"  quarantined: {quarantine_key}")
        super().__init__("\n".join(lines))


class CorruptObjectError(IntegrityError):
    """A stored object (manifest, ref) whose bytes do not match its own name or digest."""

    def __init__(self, key: str, detail: str) -> None:
        self.key = key
        self.detail = detail
        super().__init__(f"{key}: {detail}")


class PromotionRefusedError(GateRefusedError):
    """Promotion requirements unmet. ``reasons`` lists each unmet requirement."""

    def __init__(self, artifact: str, channel: str, reasons: list[str]) -> None:
        self.artifact = artifact
        self.channel = channel
        self.reasons = list(reasons)
        super().__init__(f"refusing to promote {artifact} to {channel!r}: " + "; ".join(reasons))


class CasConflictError(ConflictError):
    """A compare-and-swap update kept losing to concurrent writers."""

    def __init__(self, key: str, attempts: int) -> None:
        self.key = key
        self.attempts = attempts
        super().__init__(f"{key}: lost {attempts} compare-and-swap attempts to concurrent updates")


class SignerNotTrustedError(GateRefusedError):
    """This process would sign with a key the nodes' trusted keys refuse for the role (not a key of
    that role, unknown, or revoked): refused before anything is written, since every trusted node
    would refuse the record."""

    def __init__(self, key_id: str, role: str, why: str) -> None:
        self.key_id = key_id
        self.role = role
        self.why = why
        super().__init__(f"signing key {key_id} {why}: nodes trust only {role} keys here; nothing was written "
                         f"(BUILDCTL_SIGNING_KEY should be a trusted, unrevoked {role} key)")


class SkippedRecordsError(BuildctlError):
    """A store-wide command completed, but passed over malformed records it could not read
    (``skipped``: ``(key, why)`` each, listed in its report). Exit 10."""

    def __init__(self, command: str, skipped: list[tuple[str, str]]) -> None:
        self.skipped = list(skipped)
        first = "; ".join(f"{k} ({why})" for k, why in self.skipped[:3])
        super().__init__(f"{command} completed, skipping {len(self.skipped)} malformed record(s): {first}"
                         + (" ..." if len(self.skipped) > 3 else ""))


class NotCoveredError(GateRefusedError):
    """``pull --require-covered``: the engine is not validated on this host's soft values."""

    def __init__(self, artifact_id: str, detail: str) -> None:
        self.artifact_id = artifact_id
        self.detail = detail
        super().__init__(f"{artifact_id} is not validated on this host's soft values ({detail}); "
                         "not installing it (re-check it: buildctl upgrade prepare, or the on-driver-upgrade flow)")


class InstallError(DestinationError):
    """A pull could not write its destination or its staging copy (disk full, file size limit,
    permissions, read-only, not a directory)."""

    def __init__(self, dest: str, detail: str) -> None:
        self.dest = dest
        self.detail = detail
        super().__init__(f"install into {dest} failed, current engine untouched: {detail}")


class PreflightError(PreflightRefusedError):
    """The staged engine could not be loaded on this host; it was not installed."""

    def __init__(self, artifact: str, detail: str) -> None:
        self.artifact = artifact
        self.detail = detail
        super().__init__(f"artifact {artifact} failed its preflight load, not installed: {detail}")


class EngineUnhealthyError(PreflightRefusedError):
    """An installed engine failed this node's smoke check: the node switched back to the engine
    before it (``switched_to``; None: there was none, and ``current`` was removed). ``held_back``:
    the channel still points at an artifact that already failed here, so it was not installed again."""

    def __init__(self, artifact: str, detail: str, switched_to: str | None, held_back: bool = False) -> None:
        self.artifact = artifact
        self.detail = detail
        self.switched_to = switched_to
        self.held_back = held_back
        now = f"current is {switched_to}" if switched_to else "nothing is current"
        if held_back:
            super().__init__(f"artifact {artifact} failed its smoke check on this node before ({detail}); not "
                             f"installing it again ({now}; --retry-failed tries it once more)")
        else:
            super().__init__(f"artifact {artifact} failed its smoke check on this node, switched back ({now}): {detail}")


class StoreArgumentError(BadInputError):
    """An argument to a store operation that cannot work (bad channel name, missing reason, ambiguous target)."""


class SignatureError(IntegrityError):
    """A manifest, channel record or attestation whose signature is missing or does not verify
    against the trusted keys (``what``: which object; ``detail``: unsigned, untrusted key, bad signature)."""

    def __init__(self, what: str, detail: str) -> None:
        self.what = what
        self.detail = detail
        super().__init__(f"{what}: {detail}")


class CryptoRequiredError(IntegrityError):
    """``--require-crypto`` (``BUILDCTL_REQUIRE_CRYPTO``): an artifact whose bytes are bound by xxh3-128
    only, because its manifest has no per-file BLAKE3 (schema 1) or its record binds no manifest bytes."""

    def __init__(self, artifact: str, detail: str) -> None:
        self.artifact = artifact
        self.detail = detail
        super().__init__(f"artifact {artifact} refused under --require-crypto: {detail}")


class StaleRecordError(IntegrityError):
    """A channel record older than the channel's newest signed history record, or than the
    minimum sequence this node was provisioned with (freeze and replay protection)."""

    def __init__(self, channel: str, seq: int, newer_seq: int, source: str) -> None:
        self.channel = channel
        self.seq = seq
        self.newer_seq = newer_seq
        self.source = source
        super().__init__(f"channel {channel} record #{seq} is stale: {source} says #{newer_seq} or later; refusing "
                         "a replayed or frozen record")


class ExpiredRecordError(IntegrityError):
    """A signed channel record past its expiry: the channel's signer stopped re-signing it, or the
    record is being replayed (freeze protection, like TUF's timestamp role)."""

    def __init__(self, channel: str, seq: int, expires: str) -> None:
        self.channel = channel
        self.seq = seq
        self.expires = expires
        super().__init__(f"channel {channel} record #{seq} expired at {expires}: refusing a frozen or replayed record "
                         "(the resign-channels flow re-signs current records before they expire)")


class RolloutInProgressError(ConflictError):
    """The channel has a live rollout: a new promotion would abandon it (abort or finish it first)."""

    def __init__(self, profile: str, channel: str, seq: int, target: str) -> None:
        self.profile = profile
        self.channel = channel
        self.seq = seq
        self.target = target
        super().__init__(f"channel {channel} of {profile} has a rollout of {target} in progress (#{seq}): "
                         f"finish it, or `buildctl rollout abort --profile {profile} --channel {channel}` first")


class RolloutStateError(BadInputError):
    """A rollout command that does not apply to the rollout's state (resume a rollout that is not paused...)."""


class RollbackError(IntegrityError):
    """A channel record older than the one this node already installed (rollback protection)."""

    def __init__(self, channel: str, seq: int, installed_seq: int) -> None:
        self.channel = channel
        self.seq = seq
        self.installed_seq = installed_seq
        super().__init__(f"channel {channel} record #{seq} is older than #{installed_seq} already installed here: "
                         "refusing a rollback (a legitimate rollback is a new, higher record: buildctl rollback)")


class QuarantinedError(GateRefusedError):
    """The artifact is quarantined: never a cache hit, never promoted, never pulled (``record_key``
    names the quarantine record, ``reason`` says why)."""

    def __init__(self, artifact: str, record_key: str, reason: str, what: str = "refusing it") -> None:
        self.artifact = artifact
        self.record_key = record_key
        self.reason = reason
        super().__init__(f"artifact {artifact} is quarantined ({record_key}: {reason}); {what}")


class ScrubFoundCorruptionError(IntegrityError):
    """A scrub found artifacts whose stored bytes are wrong (each now quarantined)."""

    def __init__(self, artifacts: list[str], history: list[tuple[str, str]] | None = None) -> None:
        self.artifacts = list(artifacts)
        self.history = list(history or [])
        parts = []
        if artifacts:
            parts.append(f"{len(artifacts)} corrupt artifact(s), quarantined: {', '.join(artifacts)}")
        if self.history:
            parts.append(f"{len(self.history)} channel history record(s) no reader may act on: "
                         + "; ".join(f"{k} ({why})" for k, why in self.history))
        super().__init__("scrub found " + " and ".join(parts))


class IndexMismatchError(IntegrityError):
    """``buildctl index check``: the node index lacks markers its node records imply, or holds
    markers no record implies (``buildctl index rebuild`` repairs both). Exit 4."""

    def __init__(self, missing: list[str], stale: list[str]) -> None:
        self.missing, self.stale = list(missing), list(stale)
        first = (self.missing + self.stale)[:3]
        super().__init__(f"node index: {len(self.missing)} missing and {len(self.stale)} stale marker(s), e.g. "
                         f"{', '.join(first)}; run buildctl index rebuild")
