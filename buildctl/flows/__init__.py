"""The Prefect flows (one per module), thin over the steps (:mod:`buildctl.steps`).

Importing the package installs :class:`OneLineExpectedFailures` on Prefect's run loggers: a flow
run or task run that fails with a :class:`~buildctl.core.errors.BuildctlError` (an expected failure: a
gate refused, a host that cannot build it) is logged as one line with its cause, no traceback,
on a worker as in-process (Prefect's engine logs the exception it ends with, ``exc_info=True``).
Any other exception, a bug, keeps its traceback."""

from __future__ import annotations

import logging

from buildctl.core.errors import BuildctlError


class OneLineExpectedFailures(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, BuildctlError):
            cause = " ".join(str(exc).split())
            record.msg = f"{record.getMessage()}: {type(exc).__name__}: {cause}"
            record.args = ()
            record.exc_info = None
            record.exc_text = None
        return True


for _name in ("prefect.flow_runs", "prefect.task_runs", "prefect.flow_engine", "prefect.task_engine", "prefect.engine"):
    if not any(isinstance(f, OneLineExpectedFailures) for f in logging.getLogger(_name).filters):
        logging.getLogger(_name).addFilter(OneLineExpectedFailures())
