"""buildctl.flows (the package): an expected failure is one log line, a bug keeps its traceback."""

from __future__ import annotations

import logging
import sys

from buildctl.engines.errors import HostRequirementsError
from buildctl.flows import OneLineExpectedFailures


def _record(exc: BaseException) -> logging.LogRecord:
    try:
        raise exc
    except BaseException:
        info = sys.exc_info()
    return logging.LogRecord("prefect.flow_runs", logging.ERROR, __file__, 1,
                             "Engine execution exited with unexpected exception", (), info)


def test_a_buildctl_error_is_logged_as_one_line_and_anything_else_keeps_its_traceback():
    r = _record(HostRequirementsError("p", ["GPU count: 8 needed, 0 here", "memory"]))
    assert OneLineExpectedFailures().filter(r) and r.exc_info is None
    line = logging.Formatter().format(r)
    assert line == ("Engine execution exited with unexpected exception: HostRequirementsError: this host cannot "
                    "build p; unmet requirements: GPU count: 8 needed, 0 here; memory")
    bug = _record(ValueError("a bug"))
    assert OneLineExpectedFailures().filter(bug) and bug.exc_info is not None
    assert "Traceback" in logging.Formatter().format(bug)
    assert any(isinstance(f, OneLineExpectedFailures) for f in logging.getLogger("prefect.flow_runs").filters)


def test_a_validator_process_error_is_one_line_with_its_last_output_line():
    """A failed run's state message is this error's text: one line (no literal \\n in the UI); the
    child's output tail stays on the error and goes to the run's log as its own warning."""
    from buildctl.validators.errors import ValidatorProcessError

    err = ValidatorProcessError(1, "Traceback (most recent call last):\n  File x\nAttributeError: no init_cpu_memory_env\n")
    assert str(err) == ("the validation process exited 1 without an attestation; its last line: AttributeError: "
                        "no init_cpu_memory_env") and "File x" in err.tail
    assert str(ValidatorProcessError(-1, "", "timed out after 60s")).endswith("without an attestation: timed out after 60s")
