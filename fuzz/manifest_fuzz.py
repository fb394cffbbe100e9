"""atheris fuzz target: manifest JSON parsing must accept valid manifests and refuse everything
else with ManifestError, never any other exception.

    python fuzz/manifest_fuzz.py -max_total_time=60 [corpus_dir]
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    from buildctl.artifact_store.errors import ManifestError
    from buildctl.artifact_store.manifest import check_relpath, parse_manifest

SEED = (b'{"schema_version":1,"files":[{"path":"a/rank0.engine","size":1,"digest":"xxh3-128:'
        + b"0" * 32 + b'","executable":false}],"profile_name":"p","profile_hash":"xxh3-128:' + b"1" * 32
        + b'","backend":"aoti","compat_key":"aoti-x","fingerprint":{},"created_at":"t"}')


def test_one_input(data: bytes) -> None:
    try:
        m = parse_manifest(data)
    except ManifestError:
        return
    for f in m.files:  # whatever parses is safe to install
        check_relpath(f.path)


def main() -> None:
    import os
    import tempfile

    dirs = [a for a in sys.argv[1:] if not a.startswith("-")]
    if not dirs:
        dirs = [tempfile.mkdtemp(prefix="manifest-corpus-")]
        sys.argv.append(dirs[0])
    if not os.listdir(dirs[0]):  # start from a valid manifest so mutations reach deep validation
        with open(os.path.join(dirs[0], "seed.json"), "wb") as f:
            f.write(SEED)
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
