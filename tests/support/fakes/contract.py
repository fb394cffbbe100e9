"""The TensorRT-LLM contract fixtures (``tests/support/fixtures/trtllm/<version>/``) as argparse parsers.

Each fixture lists a tool's flags as read from TensorRT-LLM's own argparse definitions at a named
file and commit. :func:`parser` rebuilds an equivalent parser, so a fake tool rejects exactly what
the real one would at argument parsing: an unknown flag, a value outside ``choices``, a value that
does not convert to the flag's type, a missing value. argparse's own error path is used, so the
message and the exit status (2) are the real tool's.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "trtllm"
VERSIONS = ("1.2.1", "0.16")
TYPES = {"str": str, "int": int, "float": float}


def fixture(version: str, name: str) -> dict[str, Any]:
    """One fixture file, e.g. ``fixture("1.2.1", "trtllm-build")``."""
    return json.loads((FIXTURES / version / f"{name}.json").read_text())


def version_from_env() -> str:
    """The release the fakes act as (``FAKE_TRTLLM_VERSION``, default the pinned 1.2.1)."""
    v = os.environ.get("FAKE_TRTLLM_VERSION", "1.2.1")
    if v not in VERSIONS:
        raise SystemExit(f"FAKE_TRTLLM_VERSION={v!r}: no fixture (have {', '.join(VERSIONS)})")
    return v


def _type(spec: dict[str, Any]):
    t = spec.get("type", "str")
    if t.startswith("enum:"):  # KVCacheType: parsed from the lower-case names
        return str
    return TYPES[t]


def parser(version: str, tool: str) -> argparse.ArgumentParser:
    """An argparse parser with the fixture's flags, types and choices (defaults as in the fixture)."""
    data = fixture(version, tool)
    p = argparse.ArgumentParser(prog=data["tool"], allow_abbrev=True)
    for spec in data["flags"]:
        names = [spec["name"], *spec.get("aliases", [])]
        dest = spec["name"].lstrip("-")
        if spec["action"] == "store_true":
            p.add_argument(*names, dest=dest, action="store_true", default=False)
            continue
        kwargs: dict[str, Any] = {"dest": dest, "type": _type(spec)}
        default = spec.get("default")
        if isinstance(default, str) and kwargs["type"] is not str:
            default = None  # a symbolic default (BuildConfig.max_batch_size): argparse would convert the string
        kwargs["default"] = argparse.SUPPRESS if default == "SUPPRESS" else default
        if spec.get("choices") is not None:
            kwargs["choices"] = spec["choices"]
        if spec.get("nargs"):
            kwargs["nargs"] = spec["nargs"]
        p.add_argument(*names, **kwargs)
    return p


def parse(version: str, tool: str, argv: list[str]) -> argparse.Namespace:
    """Parse ``argv`` as the real tool would; exits 2 with argparse's message when it would."""
    return parser(version, tool).parse_args(argv)
