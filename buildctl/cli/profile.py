"""``buildctl profile check|show``: validate profiles and show them resolved."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

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


def _gib(n: int) -> str:
    return f"{n / 2**30:.3f} GiB" if n >= 2**27 else f"{n / 2**20:.2f} MiB"


@profile_app.command("suggest")
def profile_suggest(
    ctx: typer.Context,
    profile: str = typer.Argument(..., help="Profile name (in the profile directory) or YAML file."),
    traffic: Path = typer.Option(..., "--traffic", help="Observed requests, JSON lines: input_tokens, output_tokens, optional timestamp and concurrency."),
    model_config: Optional[Path] = typer.Option(None, "--model-config", help="The model's HF config.json (default: the tiny model's, or the local checkpoint's)."),
    coverage: float = typer.Option(1.0, "--coverage", help="Share of observed requests the lengths must fit (1.0: all; 0.999 drops the longest 0.1%)."),
    headroom: float = typer.Option(0.25, "--headroom", help="Batch size above the peak observed concurrency, as a share."),
    round_to: int = typer.Option(256, "--round", min=1, max=2**24, help="Round lengths up to a multiple of this."),
    max_bad: float = typer.Option(0.01, "--max-bad-fraction", help="Fail (exit 2) when more than this share of lines is malformed."),
    write: Optional[Path] = typer.Option(None, "--write", help="Write the profile with the recommended limits to this new file (comments are not kept)."),
    json_out: bool = typer.Option(False, "--json", help="JSON output."),
) -> None:
    """Recommend max_input_len, max_seq_len, max_num_tokens, max_batch_size and vLLM limits from
    observed traffic, with the KV-cache memory per GPU the profile reserves against what it needs."""
    import yaml
    from rich.table import Table

    from buildctl.cli._common import settings
    from buildctl.engines.errors import TrafficFileError
    from buildctl.engines.profile import load_profile, profile_path
    from buildctl.engines.sizing import model_shape, patched_profile, read_traffic, suggest

    path = Path(profile) if Path(profile).suffix in (".yaml", ".yml") else profile_path(profile, settings(ctx).profile_dir)
    prof = load_profile(path)
    s = suggest(prof, read_traffic(traffic, max_bad), model_shape(prof, model_config), coverage=coverage,
                headroom=headroom, round_to=round_to)
    if write is not None:
        if write.exists():
            raise TrafficFileError(str(write), "exists already: refusing to overwrite it", {})
        data = patched_profile(yaml.safe_load(path.read_text()), s)
        header = f"# {prof.name}, limits from `buildctl profile suggest` on {traffic.name} ({s.requests} requests)\n"
        write.write_text(header + yaml.safe_dump(data, sort_keys=False))
        try:
            load_profile(write)
        except Exception:
            write.unlink()
            raise
    if want_json(ctx, json_out):
        emit_json({"profile": prof.name, "traffic": str(traffic), **s.to_json(),
                   "written": str(write) if write else None})
        return
    console = out()
    console.print(f"{prof.name}: {s.requests} requests from {traffic}"
                  + (f"; {sum(len(v) for v in s.bad.values())} malformed line(s) skipped" if s.bad else ""), highlight=False)
    for reason, lines in sorted(s.bad.items()):
        console.print(f"  {reason}: {len(lines)} (line {', '.join(map(str, lines[:5]))}{', ...' if len(lines) > 5 else ''})",
                      highlight=False)
    t = Table(title="observed tokens")
    for c in ("", "p50", "p90", "p99", "max"):
        t.add_column(c)
    for name, q in s.lengths.items():
        t.add_row(name, *(str(q[k]) for k in ("p50", "p90", "p99", "max")))
    console.print(t)
    console.print(f"peak concurrency: {s.peak_concurrency if s.peak_concurrency is not None else 'not reported'}"
                  + (f"; peak arrivals: {s.peak_arrivals_per_s}/s" if s.peak_arrivals_per_s else ""), highlight=False)
    r = Table(title="limits")
    for c in ("setting", "profile", "recommended"):
        r.add_column(c)
    for k, v in s.recommended.items():
        r.add_row(k, str(s.current.get(k)), str(v))
    console.print(r)
    console.print(f"KV cache per GPU: the profile reserves {_gib(s.kv_reserved_bytes)} (max_batch_size x max_seq_len), "
                  f"the traffic needs {_gib(s.kv_needed_bytes)} at its peak: "
                  + (f"{s.over_provisioning:.1f}x over-provisioned; " if s.over_provisioning >= 1 else
                     f"under-provisioned ({1 / s.over_provisioning:.1f}x short); ")
                  + f"the recommendation reserves {_gib(s.kv_recommended_bytes)} "
                  f"({s.kv_bytes_per_token} bytes per token)", highlight=False)
    for note in s.notes:
        console.print(f"note: {note}", highlight=False)
    if write is not None:
        console.print(f"wrote {write}", highlight=False)
