"""Errors of the ``validators`` package."""

from __future__ import annotations

from buildctl.errors import BadInputError, BuildctlError, GateRefusedError


class ValidationFailedError(GateRefusedError):
    """The verdict was fail. The attestation was still written (``attestation_id``)."""

    def __init__(self, artifact_id: str, attestation_id: str, reasons: list[str]) -> None:
        self.artifact_id = artifact_id
        self.attestation_id = attestation_id
        self.reasons = list(reasons)
        super().__init__(f"validation of {artifact_id} failed (attestation {attestation_id} recorded): "
                         + "; ".join(reasons))


class PromptFileError(BadInputError):
    """A JSONL prompt file that cannot be read."""

    def __init__(self, source: str, line: int | None, detail: str) -> None:
        self.source = source
        self.line = line
        self.detail = detail
        where = f"{source}:{line}" if line else source
        super().__init__(f"{where}: {detail}")


class ModelMismatchError(BadInputError):
    """The reference would run other weights than the engine was built from."""

    def __init__(self, artifact_id: str, expected: str | None, actual: str) -> None:
        self.expected = expected
        self.actual = actual
        super().__init__(f"artifact {artifact_id} was built from model {expected}, but the reference model is {actual}: "
                         "parity against other weights means nothing")


class ValidatorProcessError(BuildctlError):
    """``buildctl validate`` in a child process ended without an attestation (``returncode``, ``tail``)."""

    def __init__(self, returncode: int, tail: str) -> None:
        self.returncode = returncode
        self.tail = tail
        super().__init__(f"buildctl validate exited {returncode} without an attestation:\n{tail}")
