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
) -> None:
    """Print this host's fingerprint and its compat key per backend, with which fields are hard
    (rebuild), soft (re-check) and floors."""
    from buildctl.engines.fingerprint import host_fingerprint
    from buildctl.engines.registry import backend_names

    st = settings(ctx)
    fp = host_fingerprint(st.with_flags(fingerprint_python=python) if python else st)
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
