"""``buildctl worker``: a Prefect worker that serves exactly the work this host can build, and the
work queues it and its peers poll.

``worker start`` computes this host's compat key for each backend whose build tool it has and
starts Prefect's own worker (``prefect worker start``, replacing this process) on the queues named
after them, plus ``default`` for the control flows unless ``--builds-only``. A build routed to a
compat key no live worker serves waits (Scheduled, then Late) instead of failing on the wrong host.
``worker queues`` lists a pool's queues with their last poll through the Prefect REST API. Neither
imports Prefect: the CLI never does.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any

import typer

from buildctl.cli._common import emit_json, out, settings, want_json
from buildctl.errors import BadInputError, BuildctlError

worker_app = typer.Typer(help="Prefect workers matched to this host's compat keys.", no_args_is_help=True)

CONTROL_QUEUE = "default"


class PrefectApiError(BuildctlError):
    """The Prefect API did not answer as expected (``url``, ``detail``)."""

    def __init__(self, url: str, detail: str) -> None:
        self.url = url
        self.detail = detail
        super().__init__(f"Prefect API {url}: {detail}")


def worker_command(pool: str, queues: list[str], name: str | None) -> list[str]:
    """The ``prefect worker start`` command line for these queues."""
    cmd = [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool]
    for q in queues:
        cmd += ["--work-queue", q]
    if name:
        cmd += ["--name", name]
    return cmd


@worker_app.command("start")
def start_cmd(
    ctx: typer.Context,
    pool: str = typer.Option(..., "--pool", help="The Prefect work pool (e.g. buildctl-local)."),
    builds_only: bool = typer.Option(False, "--builds-only", help="Serve only this host's compat-key queues, not the control flows' 'default' queue."),
    name: str = typer.Option(None, "--name", help="Worker name (default: Prefect's)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the queues and the command; start nothing."),
    json_out: bool = typer.Option(False, "--json", help="JSON output (with --dry-run)."),
) -> None:
    """Start a Prefect worker on the work queues of this host's compat keys."""
    from buildctl import fleet
    from buildctl.engines.fingerprint import host_fingerprint

    st = settings(ctx)
    served = fleet.serving_queues(st, host_fingerprint(st))
    if not served:
        raise BadInputError("this host has no backend's build tool (torch for aoti, tensorrt_llm for trtllm): "
                            "it can serve no build queue")
    queues = sorted(set(served.values())) + ([] if builds_only else [CONTROL_QUEUE])
    cmd = worker_command(pool, queues, name)
    if dry_run:
        if want_json(ctx, json_out):
            emit_json({"pool": pool, "queues": queues, "by_backend": served, "command": cmd})
        else:
            for backend, q in sorted(served.items()):
                out().print(f"{backend}: {q}")
            out().print(" ".join(cmd))
        return
    typer.echo(f"serving {', '.join(f'{b} ({q})' for b, q in sorted(served.items()))}"
               + ("" if builds_only else f" and {CONTROL_QUEUE}"), err=True)
    sys.stderr.flush()
    os.execv(cmd[0], cmd)  # Prefect's own worker replaces this process


def _api(base: str, path: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(base.rstrip("/") + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as err:
        raise PrefectApiError(base, f"{path}: HTTP {err.code} {err.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise PrefectApiError(base, f"{path}: {err}") from None


@worker_app.command("queues")
def queues_cmd(
    ctx: typer.Context,
    pool: str = typer.Option(..., "--pool", help="The Prefect work pool."),
    json_out: bool = typer.Option(False, "--json", help="JSON output."),
) -> None:
    """List a work pool's queues (one per compat key) with their status and last poll."""
    st = settings(ctx)
    if not st.prefect_api_url:
        raise BadInputError("no Prefect API: set PREFECT_API_URL")
    rows = [{"queue": q["name"], "status": q.get("status"), "last_polled": q.get("last_polled"),
             "paused": q.get("is_paused")} for q in _api(st.prefect_api_url, f"/work_pools/{pool}/queues/filter", {})]
    if want_json(ctx, json_out):
        emit_json(rows)
        return
    for r in sorted(rows, key=lambda r: r["queue"]):
        out().print(f"{r['queue']}  {r['status'] or '-'}  last poll {r['last_polled'] or 'never'}")
