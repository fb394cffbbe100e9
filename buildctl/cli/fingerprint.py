"""``buildctl fingerprint``: this host's fingerprint and its compat key per backend."""

from __future__ import annotations

from typing import Optional

import typer
from rich.table import Table

from buildctl.cli._common import emit_json, out, settings, want_json


def fingerprint_cmd(
    ctx: typer.Context,
    json_out: bool = typer.Option(False, "--json", help="Print the fingerprint as JSON (loadable with --fingerprint-file), "
                                  "with a backends object: per backend the compat key and its hard, soft and floor fields."),
    python: Optional[str] = typer.Option(None, "--python", help="Detect the runtime's versions in this interpreter or "
                                         "container command (/opt/serve/bin/python, 'docker exec -i serving python3'): "
                                         "where the engines are served, when this agent runs outside it "
                                         "(BUILDCTL_FINGERPRINT_PYTHON)."),
    set_fields: list[str] = typer.Option([], "--set", metavar="FIELD=VALUE",
                                         help="Print the fingerprint with this field changed, as after an upgrade "
                                              "(repeat; cpu.isa_level for nested fields; VALUE is YAML): a fingerprint "
                                              "file for --fingerprint-file, and FIELD: VALUE lines are an upgrade target."),
) -> None:
    """Print this host's fingerprint and its compat key per backend, with which fields are hard
    (rebuild), soft (re-check) and floors."""
    from buildctl.engines.fingerprint import host_fingerprint
    from buildctl.engines.registry import backend_names

    st = settings(ctx)
    fp = host_fingerprint(st.with_flags(fingerprint_python=python) if python else st)
    if set_fields:
        fp = _with_fields(fp, set_fields)
    if want_json(ctx, json_out):
        emit_json({**fp.model_dump(mode="json"), "backends": fp.backends_json()})
        return
    t = Table(title="host fingerprint", show_header=False)
    t.add_column("field")
    t.add_column("value")
    gpus = ", ".join(f"{g.name} (SM {g.sm}, {g.memory_mib} MiB)" for g in fp.gpus) or "none"
    rows = [
        ("gpus", f"{fp.gpu_count}: {gpus}"),
        ("driver", fp.driver_version), ("cuda", fp.cuda_version),
        ("tensorrt", fp.tensorrt_version), ("tensorrt-llm", fp.tensorrt_llm_version),
        ("torch", fp.torch_version), ("cpu", f"{fp.cpu.machine} {fp.cpu.isa_level}"),
        ("platform", fp.platform), ("glibc", fp.glibc_version), ("compiler", fp.compiler_version),
        ("digest", fp.digest()),
        *((f"compat key ({b})", fp.compat_key(b)) for b in backend_names()),
        *((f"soft ({b})", ", ".join(fp.backends_json()[b]["soft"])) for b in backend_names()),
        *((f"below a floor ({b})", "; ".join(p)) for b in backend_names() if (p := fp.floor_problems(b))),
    ]
    for k, v in rows:
        t.add_row(k, "-" if v is None else str(v))
    out().print(t)
    for field, where in sorted(fp.sources.items()):
        out().print(f"  {field}: {where}")


def _with_fields(fp, assignments: list[str]):
    """``fp`` with FIELD=VALUE assignments applied, checked as an upgrade target is (a field a
    fingerprint does not have, or a value of the wrong type, names itself)."""
    import yaml

    from buildctl.engines.errors import UpgradeTargetError
    from buildctl.engines.fingerprint import parse_target

    data: dict = {}
    for a in assignments:
        field, eq, raw = a.partition("=")
        if not eq or not field:
            raise UpgradeTargetError("--set", f"{a!r} is not FIELD=VALUE")
        try:
            value = yaml.safe_load(raw) if raw else ""
        except yaml.YAMLError:
            value = raw
        if field.startswith("cpu."):
            data.setdefault("cpu", {})[field.removeprefix("cpu.")] = value
        else:
            data[field] = str(value) if isinstance(value, (int, float)) and field.endswith("_version") else value
    return parse_target(data, "--set").apply(fp)
