"""``python -m buildctl.flows.local PROFILE [--promote-to staging] [--out FILE] [--wait-for-api S]``: one
build-validate-publish run in this process, against ``PREFECT_API_URL`` (``make demo`` starts a
server of its own and passes ``--wait-for-api``, so this process's imports overlap the server's
start) or, with no API URL, Prefect's local mode (a temporary server for this process). Prints the
flow's result as JSON (and writes it to ``--out``)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from buildctl.flows.build_validate_publish import build_validate_publish
from buildctl.core.settings import load_settings
from buildctl.flows.setup import ensure_build_limit


def wait_for_api(timeout_s: float, *, url: str | None = None, interval_s: float = 0.2) -> None:
    """Until the API (``url``, else the configured ``PREFECT_API_URL``) answers ``/health``; a
    one-line error after ``timeout_s``."""
    import httpx
    from prefect.settings import PREFECT_API_URL

    url = url or PREFECT_API_URL.value()
    if not url:
        raise SystemExit("error: --wait-for-api needs PREFECT_API_URL")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{url.rstrip('/')}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() >= deadline:
            raise SystemExit(f"error: the Prefect API at {url} did not answer /health within {timeout_s:g}s")
        time.sleep(interval_s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m buildctl.flows.local")
    ap.add_argument("profile")
    ap.add_argument("--promote-to", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--wait-for-api", type=float, default=0, metavar="SECONDS",
                    help="wait up to this long for PREFECT_API_URL's server to answer its health check")
    args = ap.parse_args(argv)
    if args.wait_for_api > 0:
        wait_for_api(args.wait_for_api)
    ensure_build_limit(load_settings())
    result = build_validate_publish(profile=args.profile, promote_to=args.promote_to)
    text = json.dumps(result, indent=2, sort_keys=True, default=str)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
