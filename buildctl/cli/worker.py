"""``buildctl worker``: a Prefect worker that serves exactly the work this host can build, and the
work queues it and its peers poll.

``worker start`` computes this host's compat key for each backend whose build tool it has,
creates or verifies the queues named after them on the pool (described: backend, compat key, the
key's fields; a worker polling a queue that does not exist serves nothing at all), and starts
Prefect's own worker (``prefect worker start``, replacing this process) on them, plus ``default``
for the control flows unless ``--builds-only``, named after the host and its keys. A build routed to a
compat key no live worker serves waits (Scheduled, then Late) instead of failing on the wrong host.
``worker queues`` lists a pool's queues with their last poll and flags Late runs on a queue no
live worker polls. Both go through the Prefect REST API (:mod:`buildctl.steps.worker_queues`): the CLI
never imports Prefect.
"""

from __future__ import annotations

import os
import sys

import typer

from buildctl.cli._common import emit_json, out, settings, want_json
from buildctl.core.errors import BadInputError

worker_app = typer.Typer(help="Prefect workers matched to this host's compat keys.", no_args_is_help=True)

CONTROL_QUEUE = "default"


def worker_command(pool: str, queues: list[str], name: str | None, healthcheck: bool = False) -> list[str]:
    """The ``prefect worker start`` command line for these queues."""
    cmd = [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool] + (["--with-healthcheck"] if healthcheck else [])
    for q in queues:
        cmd += ["--work-queue", q]
    if name:
        cmd += ["--name", name]
    return cmd


@worker_app.command("start")
def start_cmd(
    ctx: typer.Context,
    pool: str = typer.Option(..., "--pool", help="The Prefect work pool (e.g. buildctl-local); it must exist."),
    builds_only: bool = typer.Option(False, "--builds-only", help="Serve only this host's compat-key queues, not the control flows' 'default' queue."),
    control_only: bool = typer.Option(False, "--control-only", help="Serve only the control flows' 'default' queue, "
                                      "no build: a control worker where builds run elsewhere (Kubernetes Jobs)."),
    name: str = typer.Option(None, "--name", help="Worker name (default: this host and its compat keys)."),
    healthcheck: bool = typer.Option(False, "--healthcheck", help="Serve Prefect's worker health endpoint (--with-healthcheck, port 8080)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the queues and the command; create and start nothing."),
    json_out: bool = typer.Option(False, "--json", help="JSON output (with --dry-run)."),
) -> None:
    """Create or verify the work queues of this host's compat keys, then start a Prefect worker on them."""
    from buildctl.steps import fleet
    from buildctl.engines.fingerprint import host_fingerprint
    from buildctl.steps.worker_queues import PrefectApi, QueueSpec, describe_queue, ensure_queues, worker_name

    if builds_only and control_only:
        raise BadInputError("--builds-only and --control-only exclude each other")
    st = settings(ctx)
    fp = host_fingerprint(st)
    served = {} if control_only else fleet.serving_queues(st, fp)
    if not served and not control_only:
        raise BadInputError("this host has no backend's build tool (torch for aoti, tensorrt_llm for trtllm): "
                            "it can serve no build queue")
    # re-checks of a driver upgrade on exactly this host's soft values
    rechecks = {} if control_only else fleet.recheck_queues(st, fp)
    build_queues = sorted(set(served.values()))
    queues = build_queues + sorted(set(rechecks.values())) + ([] if builds_only else [CONTROL_QUEUE])
    name = name or worker_name(build_queues or [CONTROL_QUEUE])
    cmd = worker_command(pool, queues, name, healthcheck)
    specs = [QueueSpec(q, describe_queue(b, fp.compat_key(b), fp.compat_fields(b))) for b, q in sorted(served.items())]
    specs += [QueueSpec(q, f"re-checks on {b} {fp.compat_key(b)} with soft values "
                           + ", ".join(f"{k}={v}" for k, v in fp.soft_fields(b).items()))
              for b, q in sorted(rechecks.items())]
    if dry_run:
        if want_json(ctx, json_out):
            emit_json({"pool": pool, "queues": queues, "by_backend": served, "rechecks_by_backend": rechecks,
                       "command": cmd, "name": name,
                       "descriptions": {s.name: s.description for s in specs}})
        else:
            for backend, q in sorted(served.items()):
                out().print(f"{backend}: {q}")
            out().print(" ".join(cmd))
        return
    if not st.prefect_api_url:
        raise BadInputError("no Prefect API: set PREFECT_API_URL (the worker creates its queues there first)")
    done = ensure_queues(PrefectApi(st.prefect_api_url), pool, specs)
    typer.echo(f"worker {name} on pool {pool} polls " + ", ".join(f"{q} ({how})" for q, how in done)
               + ("" if builds_only else f" and {CONTROL_QUEUE}"), err=True)
    sys.stderr.flush()
    os.execv(cmd[0], cmd)  # Prefect's own worker replaces this process


@worker_app.command("queues")
def queues_cmd(
    ctx: typer.Context,
    pool: str = typer.Option(..., "--pool", help="The Prefect work pool."),
    json_out: bool = typer.Option(False, "--json", help="JSON output."),
) -> None:
    """List a work pool's queues (one per compat key) with their last poll; flag Late runs that no live worker serves."""
    from buildctl.steps.worker_queues import PrefectApi, queue_report

    st = settings(ctx)
    if not st.prefect_api_url:
        raise BadInputError("no Prefect API: set PREFECT_API_URL")
    rows = queue_report(PrefectApi(st.prefect_api_url), pool)
    if want_json(ctx, json_out):
        emit_json([r.to_json() for r in rows])
        return
    for r in rows:
        flag = (f"  UNSERVED: {len(r.late_runs)} Late run(s) and no live worker polls it "
                f"(start `buildctl worker start --pool {pool}` on a host with this compat key)" if r.unserved
                else f"  {len(r.late_runs)} Late" if r.late_runs else "")
        out().print(f"{r.queue}  {r.status or '-'}  last poll {r.last_polled or 'never'}{flag}")
