"""``python -m buildctl.engines.preflight BACKEND ENGINE_DIR [--fingerprint-file F] [--smoke N]``:
load an engine on this host without serving it; with ``--smoke N``, load it and generate N tokens
greedily from a fixed prompt (the node agent's smoke check after a pull).

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

SMOKE_PROMPT = (1, 5, 9, 17)  # token ids every vocabulary has
REFUSED = 2  # this program's own status for "the backend refused"; not a buildctl CLI exit code


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m buildctl.engines.preflight")
    ap.add_argument("backend")
    ap.add_argument("engine_dir", type=Path)
    ap.add_argument("--fingerprint-file", type=Path, default=None)
    ap.add_argument("--smoke", type=int, default=0, metavar="N", help="load and generate N tokens")
    args = ap.parse_args(argv)
    from buildctl.engines.registry import get_backend
    from buildctl.core.errors import BuildctlError
    from buildctl.core.settings import load_settings

    backend = get_backend(args.backend, load_settings(fingerprint_file=args.fingerprint_file))
    try:
        if args.smoke <= 0:
            backend.preflight(args.engine_dir)
        else:
            runner = backend.load(args.engine_dir)
            try:
                out = runner.generate([list(SMOKE_PROMPT)], max_tokens=args.smoke, top_logprobs=0)
            finally:
                runner.close()
            if not out or not out[0].token_ids:
                sys.stderr.write("failed: the engine loaded but generated no tokens\n")
                return 1
            sys.stdout.write(f"ok: generated {len(out[0].token_ids)} tokens: {out[0].token_ids}\n")
            return 0
    except BuildctlError as err:
        sys.stderr.write(f"refused: {err}\n")
        return REFUSED
    sys.stdout.write(f"ok: {args.backend} engine at {args.engine_dir} loads on this host\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
