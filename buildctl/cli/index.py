"""The node index: rebuild, check."""

from __future__ import annotations


import typer

from buildctl.cli._common import JSON_OPT, context, emit_json, fail_on_skipped, out, want_json


index_app = typer.Typer(help="The node index (inventory/index/): markers that let fleet-wide commands LIST "
                             "instead of reading every node record.", no_args_is_help=True)


def _index_report(ctx: typer.Context, json_out: bool, repair: bool) -> None:
    from buildctl.artifact_store.errors import IndexMismatchError
    from buildctl.steps.node_index import rebuild

    report = rebuild(context(ctx, existing=True).store, repair=repair)
    if want_json(ctx, json_out):
        emit_json(report.to_json())
    else:
        done = "written" if repair else "missing"
        out().print(f"{report.nodes} node record(s), {report.markers} marker(s): {len(report.missing)} {done}, "
                    f"{len(report.stale)} stale{' (deleted)' if repair else ''}; "
                    f"index {'in use' if report.ready else 'not built yet (readers read the records)'}")
        for key in (report.missing + report.stale)[:20]:
            out().print(f"  {key}")
    fail_on_skipped(f"index {'rebuild' if repair else 'check'}", report.skipped)
    if not repair and not report.ok:
        raise IndexMismatchError(report.missing, report.stale)


@index_app.command("rebuild")
def index_rebuild_cmd(ctx: typer.Context, json_out: bool = JSON_OPT) -> None:
    """Derive every node-index marker from the node records: write the missing ones, delete the
    stale ones, and mark the index built (the migration of a store written before it)."""
    _index_report(ctx, json_out, repair=True)


@index_app.command("check")
def index_check_cmd(ctx: typer.Context, json_out: bool = JSON_OPT) -> None:
    """Compare the node index with the node records; exit 4 on a missing or stale marker."""
    _index_report(ctx, json_out, repair=False)
