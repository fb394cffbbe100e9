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
