"""``python -m engines.preflight BACKEND ENGINE_DIR``: load an engine on this host without serving it.

Run by ``buildctl pull`` on the staged copy, in a subprocess, before ``current`` is switched.
Exit 0: loadable. Exit 2: refused (wrong host, bad build record). Anything else: failed.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m engines.preflight BACKEND ENGINE_DIR", file=sys.stderr)
        return 2
    from buildctl.errors import BuildctlError
    from engines.backend import get_backend

    try:
        get_backend(args[0]).preflight(Path(args[1]))
    except BuildctlError as err:
        print(f"refused: {err}", file=sys.stderr)
        return 2
    print(f"ok: {args[0]} engine at {args[1]} loads on this host")
    return 0


if __name__ == "__main__":
    sys.exit(main())
