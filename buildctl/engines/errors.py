"""Errors of the ``engines`` package (profiles, fingerprints, builders)."""

from __future__ import annotations

from dataclasses import dataclass

from buildctl.core.errors import BadInputError, BuildFailedError, NotFoundError, PreflightRefusedError


@dataclass(frozen=True)
class FieldProblem:
    """One validation problem: where (a dotted field path) and what rule it broke."""

    path: str
    rule: str
    message: str

    def render(self) -> str:
        where = self.path or "<root>"
        return f"{where}: {self.message} [{self.rule}]"


class ProfileError(BadInputError):
    """A build profile file does not parse or validate.

    ``source`` is the file (or ``<string>``); ``problems`` lists every field-level problem.
    """

    def __init__(self, source: str, problems: list[FieldProblem]) -> None:
        self.source = source
        self.problems = list(problems)
        lines = [f"{source}: invalid build profile ({len(problems)} problem(s))"]
        lines += [f"  {p.render()}" for p in problems]
        super().__init__("\n".join(lines))


class ProfileNotFoundError(NotFoundError):
    """A build profile file does not exist (``known``: the profiles that do, where looked up by name)."""

    def __init__(self, source: str, known: tuple[str, ...] = ()) -> None:
        self.source = source
        self.known = tuple(known)
        where = f" (profiles that exist: {', '.join(self.known)})" if self.known else ""
        super().__init__(f"{source}: build profile not found{where}")


class ServedModelError(BadInputError):
    """A served-model file (``<profile dir>/models/<name>.yaml``) does not parse, or names runtimes
    that are not profiles, are listed twice, or serve other weights or prompts (every problem listed)."""

    def __init__(self, source: str, problems: list[FieldProblem]) -> None:
        self.source = source
        self.problems = list(problems)
        lines = [f"{source}: invalid served model ({len(problems)} problem(s))"]
        lines += [f"  {p.render()}" for p in problems]
        super().__init__("\n".join(lines))


class ServedModelNotFoundError(NotFoundError):
    """A served model that has no file (``known``: the served models that do)."""

    def __init__(self, source: str, known: tuple[str, ...] = ()) -> None:
        self.source = source
        self.known = tuple(known)
        where = f" (served models: {', '.join(self.known)})" if self.known else " (no served model is defined there)"
        super().__init__(f"{source}: served model not found{where}")


class FingerprintError(BadInputError):
    """A fingerprint file does not parse or validate."""

    def __init__(self, source: str, detail: str) -> None:
        self.source = source
        self.detail = detail
        super().__init__(f"{source}: invalid fingerprint: {detail}")


class UpgradeTargetError(BadInputError):
    """An upgrade TARGET file does not parse, or names a field a fingerprint does not have."""

    def __init__(self, source: str, detail: str) -> None:
        self.source = source
        self.detail = detail
        super().__init__(f"{source}: invalid upgrade target: {detail}")


class IncompatibleTargetError(BadInputError):
    """This host cannot build (or load) an engine for the requested target.

    ``differences`` maps each compat field that differs to ``(expected, actual)``.
    """

    def __init__(self, what: str, differences: dict[str, tuple[object, object]]) -> None:
        self.differences = dict(differences)
        detail = ", ".join(f"{k}: wanted {a!r}, host has {b!r}" for k, (a, b) in differences.items())
        super().__init__(f"{what}: {detail}")


class UnroutableBuildError(BadInputError):
    """A build run started by hand (no parent flow) landed on a worker whose host cannot build its
    profile, and no live worker polls a compat-key queue of the profile's backend to send it to."""

    def __init__(self, profile: str, backend: str, pool: str, why: str) -> None:
        self.profile, self.backend, self.pool = profile, backend, pool
        super().__init__(f"this worker cannot build {profile} ({why}) and no live worker of pool {pool} polls a "
                         f"{backend} compat-key queue ({backend}-<32 hex>): run `buildctl worker start --pool {pool}` "
                         f"on a host that can build it, then start the run again")


class NoGpuLabelsError(BadInputError):
    """``node labels`` on a host where a GPU profile's backend sees no GPU (or lacks its build
    tool): no compat key for it, so no build job could select this node; ``missing``: backend ->
    the profiles that need it."""

    def __init__(self, missing: dict[str, list[str]]) -> None:
        self.missing = dict(missing)
        what = "; ".join(f"{b} (profiles {', '.join(ps)})" for b, ps in sorted(missing.items()))
        super().__init__(f"no GPU or no build tool for {what} in this runtime: no compat-key label for it; run "
                         "`buildctl node labels` in the builder image on a GPU node (with the NVIDIA runtime)")


class WrongRecheckWorkerError(BadInputError):
    """A re-check landed on a worker whose soft values are not the node's: it refuses at once
    rather than validate on values that are not the ones to be vouched for."""

    def __init__(self, wanted: str, have: str, queue: str) -> None:
        self.wanted, self.have, self.queue = wanted, have, queue
        super().__init__(f"this re-check is for {wanted}; this worker has {have}: it belongs on queue {queue}, "
                         "which a worker with those values polls (buildctl worker start)")


class HostRequirementsError(BadInputError):
    """This host cannot build a profile: every unmet requirement is listed, found before any
    download or build starts."""

    def __init__(self, profile: str, unmet: list[str]) -> None:
        self.profile = profile
        self.unmet = list(unmet)
        super().__init__(f"this host cannot build {profile}; unmet requirements: " + "; ".join(self.unmet))


class ModelSourceError(BadInputError):
    """A model checkpoint that cannot be found or read."""

    def __init__(self, source: str, detail: str) -> None:
        self.source = source
        self.detail = detail
        super().__init__(f"model {source}: {detail}")


class EngineBuildError(BuildFailedError):
    """A build failed. ``kind`` is one of crashed, timeout, memory, exit, incomplete, error.

    ``returncode``/``signal`` describe the process, ``log_path`` holds the full log and
    ``log_tail`` its last lines (also in the message).
    """

    def __init__(self, backend: str, kind: str, detail: str, *, returncode: int | None = None,
                 signal: int | None = None, log_path: str | None = None, log_tail: str = "") -> None:
        self.backend = backend
        self.kind = kind
        self.detail = detail
        self.returncode = returncode
        self.signal = signal
        self.log_path = log_path
        self.log_tail = log_tail
        msg = f"{backend} build failed ({kind}): {detail}"
        if log_path:
            msg += f"\nfull log: {log_path}"
        if log_tail:
            msg += "\n--- log tail ---\n" + log_tail.rstrip()
        super().__init__(msg)


class EngineLoadError(BadInputError):
    """An engine directory that cannot be loaded (missing files, bad build record)."""

    def __init__(self, engine_dir: str, detail: str) -> None:
        self.engine_dir = engine_dir
        self.detail = detail
        super().__init__(f"cannot load engine {engine_dir}: {detail}")


class GenerationRequestError(BadInputError):
    """A generation request the engine cannot serve (prompt too long for max_seq_len, empty prompt)."""


class UnknownBackendError(BadInputError):
    """A backend name that is not in the registry (``known`` lists the registered names)."""

    def __init__(self, name: str, known: tuple[str, ...]) -> None:
        self.name = name
        self.known = tuple(known)
        super().__init__(f"unknown backend {name!r} (known: {', '.join(known)})")


class PreflightLoadError(PreflightRefusedError):
    """The preflight subprocess could not load the engine (``backend``, ``detail``: how it failed)."""

    def __init__(self, backend: str, detail: str) -> None:
        self.backend = backend
        self.detail = detail
        super().__init__(f"{backend} preflight failed: {detail}")


class ProfileCheckFailed(BadInputError):
    """Several profile files failed; ``errors`` holds each file's error, the message all of them."""

    def __init__(self, errors: list[BadInputError]) -> None:
        self.errors = list(errors)
        super().__init__("\n".join(str(e) for e in errors))


class TrafficFileError(BadInputError):
    """A traffic file (or a sizing argument) that cannot be used: ``bad`` maps each reason a line
    was malformed to its line numbers."""

    def __init__(self, source: str, detail: str, bad: dict[str, list[int]]) -> None:
        self.source = source
        self.detail = detail
        self.bad = dict(bad)
        reasons = "; ".join(f"{reason}: {len(lines)} (line {', '.join(map(str, lines[:5]))}"
                            f"{', ...' if len(lines) > 5 else ''})" for reason, lines in sorted(self.bad.items()))
        super().__init__(f"{source}: {detail}" + (f" [{reasons}]" if reasons else ""))
