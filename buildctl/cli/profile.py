"""``buildctl profile check|show``: validate profiles and show them resolved."""

from __future__ import annotations

from pathlib import Path

import typer

from buildctl.cli._common import emit_json, out, want_json

profile_app = typer.Typer(help="Check and show build profiles.", no_args_is_help=True)


@profile_app.command("check")
def profile_check(
    ctx: typer.Context,
    files: list[Path] = typer.Argument(..., help="Profile YAML files."),
    json_out: bool = typer.Option(False, "--json", help="JSON output."),
) -> None:
    """Validate profile files; every problem names the file, the field path and the rule."""
    from buildctl.engines.errors import ProfileCheckFailed, ProfileError
    from buildctl.engines.profile import load_profile

    results, failures = [], []
    for f in files:
        try:
            p = load_profile(f)
            results.append({"file": str(f), "ok": True, "name": p.name, "build_hash": p.build_hash()})
        except ProfileError as err:
            failures.append(err)
            results.append({"file": str(f), "ok": False,
                            "problems": [{"path": x.path, "rule": x.rule, "message": x.message} for x in err.problems]})
    if want_json(ctx, json_out):
        emit_json(results)
    else:
        for r in results:
            if r["ok"]:
                out().print(f"ok  {r['file']}  {r['name']}  {r['build_hash']}")
    if failures:
        if len(failures) == 1:
            raise failures[0]
        raise ProfileCheckFailed(list(failures))


@profile_app.command("show")
def profile_show(
    ctx: typer.Context,
    file: Path = typer.Argument(..., help="Profile YAML file."),
    json_out: bool = typer.Option(False, "--json", help="JSON output."),
) -> None:
    """Print the resolved profile (defaults filled in) and its build-affecting hash."""
    import yaml

    from buildctl.engines.profile import HASH_EXCLUDED_FIELDS, load_profile

    p = load_profile(file)
    resolved = p.model_dump(mode="json")
    if want_json(ctx, json_out):
        emit_json({"file": str(file), "build_hash": p.build_hash(), "profile": resolved,
                   "hash_excludes": HASH_EXCLUDED_FIELDS})
        return
    console = out()
    console.print(f"# {file}", highlight=False)
    console.print(f"# build hash: {p.build_hash()}", highlight=False)
    console.print(f"# not hashed: {', '.join(HASH_EXCLUDED_FIELDS)}", highlight=False)
    console.print(yaml.safe_dump(resolved, sort_keys=False), highlight=False, markup=False)
