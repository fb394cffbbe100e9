"""``python -m buildctl.flows.local PROFILE [--promote-to staging] [--out FILE]``: one build-validate-publish
run in Prefect's local mode (no API URL: a temporary server for this process), as ``make demo``
runs it. Prints the flow's result as JSON (and writes it to ``--out``)."""

from __future__ import annotations

import argparse
import json
import sys

from buildctl.flows.build_validate_publish import build_validate_publish
from buildctl.settings import load_settings
from buildctl.flows.setup import ensure_build_limit


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m buildctl.flows.local")
    ap.add_argument("profile")
    ap.add_argument("--promote-to", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    ensure_build_limit(load_settings())
    result = build_validate_publish(profile=args.profile, promote_to=args.promote_to)
    text = json.dumps(result, indent=2, sort_keys=True, default=str)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
