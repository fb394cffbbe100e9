"""The root of buildctl's error hierarchy.

Every error raised on purpose by buildctl derives from :class:`BuildctlError`. The direct
subclasses below are the *categories* that the CLI maps to exit codes (see
``buildctl.cli.main.EXIT_CODES``); each package's own ``errors.py`` derives its errors from one
of them. Details are carried as attributes, never parsed out of messages.
"""

from __future__ import annotations

import errno


class BuildctlError(Exception):
    """Base class of every deliberate buildctl error."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class BadInputError(BuildctlError):
    """Invalid input: a profile, manifest, fingerprint file or argument that does not parse or validate."""


class PathArgumentError(BadInputError):
    """A path that cannot name a file: too long, through a file, or a loop of links (the
    filesystem's ENAMETOOLONG, ENOTDIR, ELOOP on a path the user gave)."""


# The errno values that only a path's shape causes (never the disk's state): exit 2, bad input.
PATH_ERRNOS = frozenset({errno.ENAMETOOLONG, errno.ENOTDIR, errno.ELOOP})


def as_path_error(err: BaseException) -> PathArgumentError | None:
    """``err`` as a :class:`PathArgumentError` when it is an OSError that only a path's shape causes."""
    if isinstance(err, OSError) and err.errno in PATH_ERRNOS:
        where = err.filename if err.filename is not None else "a path"
        return PathArgumentError(f"{where}: {err.strerror}")
    return None


class NotFoundError(BuildctlError):
    """Something named does not exist: an artifact, a channel, a profile, a file."""


class IntegrityError(BuildctlError):
    """Stored or transferred bytes do not match what a manifest promises."""


class GateRefusedError(BuildctlError):
    """A gate said no: validation failed or promotion requirements are unmet."""


class ConflictError(BuildctlError):
    """A concurrent update won and retries ran out."""


class BuildFailedError(BuildctlError):
    """A builder crashed, timed out or produced incomplete output."""


class UnavailableError(BuildctlError):
    """The store cannot be reached, or refused this process's credentials."""


class PreflightRefusedError(BuildctlError):
    """An engine failed its preflight load on this host, so it was not installed."""


class DestinationError(BuildctlError):
    """A directory on this host cannot be written (full disk, read-only, permissions, a file where a
    directory belongs); what was installed there stays as it was."""


# The errno values of a host's disk that cannot take a write: exit 12 wherever they surface.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})


def as_disk_error(err: BaseException) -> "DestinationError | None":
    """``err`` as a :class:`DestinationError` when it is an OSError of a disk that cannot take a
    write (full, over quota, read-only), wherever a command met it."""
    if isinstance(err, OSError) and err.errno in DISK_ERRNOS:
        where = f": {err.filename}" if err.filename is not None else ""
        return DestinationError(f"{err.strerror}{where}")
    return None


class EventNotDeliveredError(BuildctlError):
    """The work was done and recorded, but a Prefect event it owes could not be delivered; the
    record keeps it pending and the next run re-sends it."""


class NoRuntimeFitsError(BuildctlError):
    """No runtime of a served model fits this node: each was passed over (no artifact for the
    node's compat key, quarantined, or refused by a check); ``passed_over`` holds
    ``(profile, reason)`` for every one, in the model's order. What was installed stays."""

    def __init__(self, model: str, passed_over: list[tuple[str, str]]) -> None:
        self.model = model
        self.passed_over = list(passed_over)
        super().__init__(f"no runtime of served model {model} fits this node: "
                         + "; ".join(f"{p}: {why}" for p, why in self.passed_over))
