"""``python -m buildctl.engines.preflight BACKEND ENGINE_DIR [--fingerprint-file F]``: load an
engine on this host without serving it.

Run by ``buildctl pull`` on the staged copy, in a subprocess, before ``current`` is switched: a
crash while loading (a segfault in a C++ runtime, SIGILL from a foreign ISA) cannot take the
caller down. It is a program, not library code: it builds its settings from its arguments and
the environment it was started with. The result is the exit status: 0 loadable; the
:data:`REFUSED` status when the backend refused the engine (wrong host, bad build record);
anything else, including death by a signal, failed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REFUSED = 2  # this program's own status for "the backend refused"; not a buildctl CLI exit code


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m buildctl.engines.preflight")
    ap.add_argument("backend")
    ap.add_argument("engine_dir", type=Path)
    ap.add_argument("--fingerprint-file", type=Path, default=None)
    args = ap.parse_args(argv)
    from buildctl.engines.registry import get_backend
    from buildctl.errors import BuildctlError
    from buildctl.settings import load_settings

    try:
        get_backend(args.backend, load_settings(fingerprint_file=args.fingerprint_file)).preflight(args.engine_dir)
    except BuildctlError as err:
        sys.stderr.write(f"refused: {err}\n")
        return REFUSED
    sys.stdout.write(f"ok: {args.backend} engine at {args.engine_dir} loads on this host\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
