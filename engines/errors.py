"""Errors of the ``engines`` package (profiles, fingerprints, builders)."""

from __future__ import annotations

from dataclasses import dataclass

from buildctl.errors import BadInputError, NotFoundError


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
    """A build profile file does not exist."""

    def __init__(self, source: str) -> None:
        self.source = source
        super().__init__(f"{source}: build profile not found")


class FingerprintError(BadInputError):
    """A fingerprint file does not parse or validate."""

    def __init__(self, source: str, detail: str) -> None:
        self.source = source
        self.detail = detail
        super().__init__(f"{source}: invalid fingerprint: {detail}")


class IncompatibleTargetError(BadInputError):
    """This host cannot build (or load) an engine for the requested target.

    ``differences`` maps each compat field that differs to ``(expected, actual)``.
    """

    def __init__(self, what: str, differences: dict[str, tuple[object, object]]) -> None:
        self.differences = dict(differences)
        detail = ", ".join(f"{k}: wanted {a!r}, host has {b!r}" for k, (a, b) in differences.items())
        super().__init__(f"{what}: {detail}")
