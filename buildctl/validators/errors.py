"""Errors of the ``validators`` package."""

from __future__ import annotations

from typing import TYPE_CHECKING

from buildctl.core.errors import BadInputError, BuildctlError, GateRefusedError

if TYPE_CHECKING:
    from buildctl.artifact_store.trust.attestations import Attestation


class ValidationFailedError(GateRefusedError):
    """The verdict was fail. The attestation was still written (``attestation_id``, ``attestation``)."""

    def __init__(self, artifact_id: str, attestation_id: str, attestation: "Attestation") -> None:
        self.artifact_id = artifact_id
        self.attestation_id = attestation_id
        self.attestation = attestation
        self.reasons = list(attestation.reasons)
        super().__init__(self._describe())

    def _describe(self) -> str:
        return (f"validation of {self.artifact_id} failed (attestation {self.attestation_id} recorded): "
                + "; ".join(self.reasons))


class ValidationInconclusiveError(ValidationFailedError):
    """The speed gate could not decide within its budget: an interval straddles a threshold. The
    attestation (verdict ``inconclusive``) was written; promote refuses it like a fail."""

    def _describe(self) -> str:
        return (f"validation of {self.artifact_id} was inconclusive (attestation {self.attestation_id} recorded): "
                + "; ".join(self.reasons)
                + f". The machine was too noisy to decide within the budget; rerun with a larger one "
                f"(buildctl validate {self.artifact_id} --speed-budget 2) or on a quieter host.")


def verdict_error(artifact_id: str, attestation_id: str, attestation: "Attestation") -> ValidationFailedError:
    """The error a non-passing attestation is raised as: inconclusive or failed."""
    kind = ValidationInconclusiveError if attestation.verdict == "inconclusive" else ValidationFailedError
    return kind(artifact_id, attestation_id, attestation)


class PromptFileError(BadInputError):
    """A JSONL prompt file that cannot be read."""

    def __init__(self, source: str, line: int | None, detail: str) -> None:
        self.source = source
        self.line = line
        self.detail = detail
        where = f"{source}:{line}" if line else source
        super().__init__(f"{where}: {detail}")


class UnknownPromptSetError(BadInputError):
    """A prompt set name that is not built in (``known`` lists the built-in ones)."""

    def __init__(self, name: str, known: tuple[str, ...]) -> None:
        self.name = name
        self.known = tuple(known)
        super().__init__(f"unknown prompt set {name!r} (known: {', '.join(known)})")


class ModelMismatchError(BadInputError):
    """The reference would run other weights than the engine was built from."""

    def __init__(self, artifact_id: str, expected: str | None, actual: str) -> None:
        self.expected = expected
        self.actual = actual
        super().__init__(f"artifact {artifact_id} was built from model {expected}, but the reference model is {actual}: "
                         "parity against other weights means nothing")


class ValidatorProcessError(BuildctlError):
    """The validation child process ended without an attestation (``returncode``, ``tail``: its
    output's last lines, ``error``: the error it reported, if any)."""

    def __init__(self, returncode: int, tail: str, error: str | None = None) -> None:
        self.returncode = returncode
        self.tail = tail
        self.error = error
        last = next((ln.strip() for ln in reversed(tail.splitlines()) if ln.strip()), "")
        what = f": {error}" if error else (f"; its last line: {last}" if last else "")
        # one line (a run's state message and the CLI's error); the whole tail stays in ``tail``
        super().__init__(" ".join(f"the validation process exited {returncode} without an attestation{what}".split()))
