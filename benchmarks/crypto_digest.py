"""What BLAKE3-256 beside xxh3-128 costs: deep verify and pull of one engine-like tree published
as a schema 2 artifact (both digests, checked in one pass) and as a schema 1 artifact (xxh3-128
only, as written before BLAKE3), on the local store and on SeaweedFS on 127.0.0.1.

    python -m benchmarks.crypto_digest [--size-gib 1] [--reps 5]

Both artifacts name the same blobs (the content address is xxh3-128 either way), so the two sides
read the same objects; only the hashing differs. Every method runs ``--reps`` times, interleaved
(A B C D, D C B A, ...); the ratio is per round (schema 2's time over schema 1's in the same
round), reported as the median with min-max. The comparison against plain tools (pull and
publish against boto3 and the AWS CLI, with BLAKE3 included) is ``benchmarks.transfer``'s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from benchmarks.common import GIB, finish, fmt_spread, interleaved, make_engine_tree, spread, table

REPO = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.crypto_digest")
    ap.add_argument("--size-gib", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)

    from buildctl.steps import build
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.artifact_store.node.install_dir import install_artifact
    from buildctl.artifact_store.publish import publish_tree
    from buildctl.artifact_store.read import verify
    from buildctl.engines.profile import load_profile
    from buildctl.core.settings import load_settings
    from tests.support.helpers import publish_schema1
    from tests.support.s3server import SeaweedServer

    work = Path(tempfile.mkdtemp(prefix="buildctl-bench-crypto-"))
    server = SeaweedServer(work / "weed").start()
    os.environ.update(server.env())
    try:
        settings = load_settings(cache_dir=work / "cache")
        draft = build.manifest_draft(load_profile(REPO / "build_profiles" / "tiny-llama-cpu.yaml"),
                                        build.host_fingerprint(settings))
        tree = make_engine_tree(work / "tree", int(args.size_gib * GIB))
        size = sum(p.stat().st_size for p in tree.rglob("*") if p.is_file())
        stores = {"local": open_store(str(work / "store")), "s3": open_store(f"s3://{server.new_bucket()}/bench")}
        ids = {}
        for name, s in stores.items():
            ids[name, 2] = publish_tree(s, tree, draft).artifact_id
            ids[name, 1] = publish_schema1(s, tree, draft)

        def pull_into(s, aid):
            dest = work / "node"
            shutil.rmtree(dest, ignore_errors=True)
            install_artifact(s, aid, dest)

        methods = {}
        for name, s in stores.items():
            for schema in (2, 1):
                aid = ids[name, schema]
                methods[f"verify --deep / {name} / {schema}"] = lambda s=s, aid=aid: verify(s, aid, deep=True)
                methods[f"pull / {name} / {schema}"] = lambda s=s, aid=aid: pull_into(s, aid)
        times = interleaved(methods, args.reps)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)

    rows, summary = [], {}
    for op in ("verify --deep", "pull"):
        for name in stores:
            both, xxh = times[f"{op} / {name} / 2"], times[f"{op} / {name} / 1"]
            ratios = [a / b for a, b in zip(both, xxh)]
            med, lo, hi = spread(ratios)
            rows.append([op, name, fmt_spread(both), fmt_spread(xxh), f"{size / GIB / spread(both)[0]:.2f}",
                         f"{med:.2f} ({lo:.2f}-{hi:.2f})x"])
            summary[f"{op} / {name}"] = {"both_s": spread(both), "xxh3_only_s": spread(xxh),
                                         "ratio": {"median": round(med, 3), "min": round(lo, 3), "max": round(hi, 3)}}
    text = table(f"BLAKE3-256 + xxh3-128 against xxh3-128 only, {size / GIB:.2f} GiB engine-like tree "
                 f"({args.reps} interleaved rounds; median (min-max))",
                 ["operation", "store", "both digests, s", "xxh3 only, s", "GiB/s (both)", "time ratio, per round"],
                 rows)
    text += ("\n\nSchema 2 (both digests in one pass) against schema 1 (xxh3-128 only) of the same blobs. "
             "Pull includes the download, both checks and the atomic install; the local store's pull is a "
             "local copy, so hashing weighs most there.")
    finish("crypto_digest", text, {"bytes": size, "reps": args.reps, "operations": summary})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
