"""Validation in a child process, as a library call that returns the typed attestation.

vLLM keeps per-process global state (one engine per process), so long-lived callers (a Prefect
worker, a test session) validate in a child. The parent hands the child its settings and the
request as JSON; the child runs :func:`buildctl.steps.validate.validate` and writes a
:class:`ChildResult` (the attestation, or the error it hit) to a file the parent reads back. The
child's exit status is not interpreted: the result file is the answer.

``python -m buildctl.steps.validate_process REQUEST RESULT`` is the child's entry point.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pydantic import Field, ValidationError

from buildctl.core.records import Record
from buildctl.core.logtail import log_tail, tailing
from buildctl.core.settings import Settings
from buildctl.artifact_store.trust.attestations import Attestation
from buildctl.validators.errors import ValidationFailedError, ValidatorProcessError


class ChildRequest(Record):
    """What the child validates, with whose settings."""

    settings: dict = Field(..., description="The parent's settings, as JSON.")
    artifact_id: str = Field(..., description="The artifact to validate.")
    profile_path: str | None = Field(None, description="The profile file, when not found by name.")
    speed_budget: float = Field(1.0, gt=0, description="Multiplier of the speed gate's budget.")


class ChildResult(Record):
    """What the child reports: an attestation (pass or fail), or the error that prevented one."""

    attestation_id: str | None = Field(None, description="The stored attestation's id.")
    attestation: Attestation | None = Field(None, description="The attestation written.")
    error: str | None = Field(None, description="Type and message of the error that prevented an attestation.")


@dataclass(frozen=True)
class ValidationOutcome:
    """A finished validation: its stored attestation (pass or fail)."""

    attestation_id: str
    attestation: Attestation
    reused: bool = False  # an earlier attestation reused, not a new validation

    @property
    def passed(self) -> bool:
        return self.attestation.passed


#: The child's progress lines start with this; the parent passes them on.
PHASE = "[validate] "


def validate_in_subprocess(settings: Settings, artifact_id: str, *, profile_path: str | Path | None = None,
                           speed_budget: float = 1.0, timeout_s: float = 3600,
                           say: Callable[[str], None] | None = None) -> ValidationOutcome:
    """Validate ``artifact_id`` in a child process; returns its attestation, passing, failing or
    inconclusive. Raises :class:`ValidatorProcessError` when the child produced none. ``say``
    gets the child's phases as they happen (the reference up, parity, each speed repetition)."""
    with tempfile.TemporaryDirectory(prefix="buildctl-validate-") as tmp:
        request, result = Path(tmp) / "request.json", Path(tmp) / "result.json"
        request.write_text(ChildRequest(settings=settings.model_dump(mode="json"), artifact_id=artifact_id,
                                        profile_path=str(profile_path) if profile_path else None,
                                        speed_budget=speed_budget).model_dump_json())
        cmd = [sys.executable, "-m", "buildctl.steps.validate_process", str(request), str(result)]
        err_log = Path(tmp) / "stderr.log"
        try:
            with open(err_log, "wb") as err_file, tailing(err_log, say or (lambda _: None), prefix="",
                                                         keep=lambda line: line.startswith(PHASE)):
                r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=err_file, timeout=timeout_s,
                                   stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise ValidatorProcessError(-1, "", f"timed out after {timeout_s:.0f}s") from None
        tail = log_tail(err_log, 15)
        try:
            got = ChildResult.model_validate_json(result.read_text())
        except (OSError, ValidationError):
            raise ValidatorProcessError(r.returncode, tail) from None
    if got.attestation is None or got.attestation_id is None:
        raise ValidatorProcessError(r.returncode, tail, got.error)
    return ValidationOutcome(got.attestation_id, got.attestation)


def main(argv: list[str] | None = None) -> int:
    """The child: validate, write the result file. Any error is reported in the file."""
    args = sys.argv[1:] if argv is None else argv
    request_path, result_path = Path(args[0]), Path(args[1])
    from buildctl.steps import validate
    from buildctl.steps.context import Context
    from buildctl.core.errors import BuildctlError

    req = ChildRequest.model_validate_json(request_path.read_text())
    settings = Settings(**req.settings)
    try:
        res = validate.validate(Context.from_settings(settings), req.artifact_id,
                                         profile_path=req.profile_path, speed_budget=req.speed_budget,
                                         say=lambda m: (sys.stderr.write(f"{PHASE}{m}\n"), sys.stderr.flush()))
        out = ChildResult(attestation_id=res.attestation_id, attestation=res.attestation)
    except ValidationFailedError as err:
        out = ChildResult(attestation_id=err.attestation_id, attestation=err.attestation)
    except BuildctlError as err:
        out = ChildResult(error=f"{type(err).__name__}: {err}")
    result_path.write_text(out.model_dump_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
