"""The run summaries the flows publish as Prefect markdown artifacts: what an on-call engineer
reads on a run's page. Pure functions over plain values (no Prefect here), so that every run,
failed ones included, gets the same page: what triggered it, what it did, the one-line cause of a
failure and the step it happened in, and the next command to run."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any

from buildctl.core.errors import BuildctlError


def one_line(err: BaseException) -> str:
    """A failure's cause in one line: a BuildctlError's message (never a traceback)."""
    text = str(err).strip().splitlines()
    first = text[0] if text else ""
    return first if isinstance(err, BuildctlError) else f"{type(err).__name__}: {first}"


def describe_trigger(trigger: dict[str, Any] | None) -> str:
    """What started the run, from the ``trigger`` parameter the parent flow passes."""
    if not trigger:
        return "started by hand or through the API (no trigger recorded)"
    kind = trigger.get("kind")
    if kind == "driver-upgrade":
        keys = trigger.get("compat_keys") or {}
        change = "; ".join(f"{b}: {old or 'none'} → {new}" for b, (old, new) in sorted(keys.items()))
        event = f" (event {trigger['event_id']})" if trigger.get("event_id") else ""
        return f"driver upgrade reported by node {trigger.get('node_id')}{event}" + (f"; {change}" if change else "")
    if kind == "reconcile":
        return f"reconcile-fleet: {trigger.get('nodes', '?')} node(s) need this (profile, compat key)"
    if kind == "by-hand":
        return (f"started by hand on queue {trigger.get('routed_from')}, whose worker could not build it: "
                "routed to this compat key's queue")
    if kind == "heal":
        return f"heal-artifact: rebuild of quarantined {trigger.get('artifact_id')}"
    return ", ".join(f"{k}={v}" for k, v in sorted(trigger.items()))


def advice(err: BaseException, *, compat_key: str | None) -> list[str]:
    """What to do next about a failure, by error type."""
    from buildctl.engines.errors import (BuildFailedError, HostRequirementsError, IncompatibleTargetError,
                                         ProfileNotFoundError)
    from buildctl.validators.errors import ValidationFailedError, ValidationInconclusiveError

    if isinstance(err, ValidationInconclusiveError):
        return [f"buildctl validate {err.artifact_id} --speed-budget 2   # on a quieter worker",
                f"buildctl show {err.artifact_id}"]
    if isinstance(err, ValidationFailedError):
        return [f"buildctl show {err.artifact_id}   # the failing attestation {err.attestation_id}"]
    if isinstance(err, HostRequirementsError):
        return [f"fix on the worker {socket.gethostname()}: {u}" for u in err.unmet]
    needs = getattr(err, "needs", None)
    if needs:  # a re-check that no worker with the node's soft values ran (RecheckNotCoveredError)
        return [f"buildctl worker start --pool POOL   # on a host with the node's soft values; {n}" for n in needs]
    if isinstance(err, IncompatibleTargetError):
        return [f"buildctl worker start --pool POOL   # on a host whose compat key is {compat_key or 'the target'}"]
    if isinstance(err, ProfileNotFoundError):
        return [f"run again with profile one of: {', '.join(err.known)}" if err.known
                else "add the profile's YAML to the profile directory (BUILDCTL_PROFILE_DIR)"]
    if isinstance(err, BuildFailedError):
        log = getattr(err, "log_path", None)
        return [f"less {log}   # on worker {socket.gethostname()}" if log else "read the run's logs"]
    return ["read the run's logs (the full traceback is there)"]


@dataclass
class RunReport:
    """A run's summary, filled in step by step; rendered whether the run succeeds or fails."""

    title: str
    compat_key: str | None = None  # the target, then the planned key: names the run's artifacts
    rows: list[tuple[str, str]] = field(default_factory=list)
    step: str = "start"
    failure: BaseException | None = None
    next_steps: list[str] = field(default_factory=list)

    def add(self, key: str, value: str) -> None:
        self.rows.append((key, value))

    def fail(self, err: BaseException) -> None:
        self.failure = err
        self.next_steps = advice(err, compat_key=self.compat_key)
        log = getattr(err, "log_path", None)
        if log:
            self.add("build log", f"`{log}` on worker `{socket.gethostname()}` (kept after the failure)")

    def markdown(self) -> str:
        head = f"# {self.title}\n\n"
        if self.failure is not None:
            head += (f"**FAILED at step `{self.step}`:** {_cell(one_line(self.failure))}\n\n"
                     f"Error type: `{type(self.failure).__name__}`\n\n")
        table = "| field | value |\n|---|---|\n" + "".join(f"| {k} | {_cell(v)} |\n" for k, v in self.rows)
        nxt = ("\n**Next:**\n\n" + "".join(f"- `{c}`\n" for c in self.next_steps)) if self.next_steps else ""
        return head + table + nxt


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
