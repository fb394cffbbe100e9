"""Transfer: buildctl publish and pull against the tools users would pick instead, on SeaweedFS
(S3) on 127.0.0.1, with the same engine-like directory.

    python -m benchmarks.transfer [--size-gib 1] [--awscli PATH]

* publish: ``buildctl import`` (hash + conditional, checksummed, multipart upload) vs
  ``aws s3 cp --recursive`` and plain boto3 ``upload_file`` (classic and CRT transfer clients);
* pull: ``buildctl pull`` (download + verify + atomic install) vs ``aws s3 cp --recursive`` and
  plain boto3 ``download_file``.

Goals: publish <= 1.1x and pull <= 1.1x the time of the fastest plain tool.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.common import GIB, MIB, finish, make_engine_tree, table, timed, tree_files


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-gib", type=float, default=1.0)
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "buildctl-bench-tree-transfer")
    ap.add_argument("--awscli", default=os.environ.get("BUILDCTL_BENCH_AWSCLI") or shutil.which("aws"))
    args = ap.parse_args(argv)

    from boto3.s3.transfer import TransferConfig

    from buildctl.store import s3 as s3mod
    from buildctl.store.pull import install_artifact
    from buildctl.store.s3 import S3Store
    from buildctl.pipeline import import_engine
    from buildctl.settings import load_settings
    from buildctl.engines.fingerprint import detect
    from buildctl.engines.profile import load_profile
    from tests.s3server import SeaweedServer

    root = make_engine_tree(args.dir, int(args.size_gib * GIB))
    files = tree_files(root)
    total = sum(p.stat().st_size for p in files)
    work = Path(tempfile.mkdtemp(prefix="buildctl-bench-"))
    server = SeaweedServer(work / "weed").start()
    os.environ.update(server.env())
    client = server.client()
    profile = load_profile(Path(__file__).resolve().parent.parent / "build_profiles" / "tiny-llama-cpu.yaml")
    fp = detect()
    up: dict[str, float] = {}
    down: dict[str, float] = {}
    notes: list[str] = []
    try:
        def fresh_bucket() -> str:
            return server.new_bucket()

        def boto_upload(config: TransferConfig) -> None:
            bucket = fresh_bucket()
            with ThreadPoolExecutor(max_workers=4) as pool:
                list(pool.map(lambda p: client.upload_file(str(p), bucket, str(p.relative_to(root)), Config=config), files))

        up["boto3 upload_file (classic)"] = timed(lambda: boto_upload(TransferConfig(multipart_chunksize=64 * MIB,
                                                                                     max_concurrency=8)))[0]
        try:
            up["boto3 upload_file (CRT)"] = timed(lambda: boto_upload(TransferConfig(preferred_transfer_client="crt")))[0]
        except Exception as err:  # noqa: BLE001 - recorded, not fatal
            notes.append(f"boto3 CRT transfer client failed against SeaweedFS: {type(err).__name__}: {str(err)[:120]}")
        aws_env = {**os.environ}
        if args.awscli:
            bucket = fresh_bucket()
            up["aws s3 cp --recursive"] = timed(lambda: subprocess.run(
                [args.awscli, "s3", "cp", "--recursive", "--quiet", str(root), f"s3://{bucket}/"], check=True,
                env=aws_env))[0]
        else:
            notes.append("awscli not available: aws s3 cp not measured")
        store = S3Store(f"s3://{fresh_bucket()}/buildctl")
        t, res = timed(lambda: import_engine(load_settings(), store, root, profile, fp))
        up["buildctl import"] = t

        # downloads of the same bytes
        src_bucket = store.bucket

        def boto_download() -> None:
            dest = work / "dl-boto"
            shutil.rmtree(dest, ignore_errors=True)
            keys = [k for k in store.list("blobs/")]
            dest.mkdir(parents=True)
            cfg = TransferConfig(multipart_chunksize=64 * MIB, max_concurrency=8)
            with ThreadPoolExecutor(max_workers=4) as pool:
                list(pool.map(lambda k: client.download_file(src_bucket, store.prefix + k, str(dest / k.replace("/", "_")),
                                                             Config=cfg), keys))

        down["boto3 download_file (classic)"] = timed(boto_download)[0]
        if args.awscli:
            dest = work / "dl-aws"
            down["aws s3 cp --recursive"] = timed(lambda: subprocess.run(
                [args.awscli, "s3", "cp", "--recursive", "--quiet", f"s3://{src_bucket}/buildctl/blobs/", str(dest)],
                check=True, env=aws_env))[0]
        down["buildctl pull (download + verify + install)"] = timed(
            lambda: install_artifact(store, res.artifact_id, work / "node"))[0]
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)

    best_up = min(v for k, v in up.items() if not k.startswith("buildctl"))
    best_down = min(v for k, v in down.items() if not k.startswith("buildctl"))
    rows = [["publish", k, f"{v:.2f}", f"{total / v / MIB:.0f}", f"{v / best_up:.2f}x"] for k, v in up.items()]
    rows += [["pull", k, f"{v:.2f}", f"{total / v / MIB:.0f}", f"{v / best_down:.2f}x"] for k, v in down.items()]
    pub_ratio = up["buildctl import"] / best_up
    pull_ratio = down["buildctl pull (download + verify + install)"] / best_down
    text = table(f"transfer {total / GIB:.2f} GiB in {len(files)} files, SeaweedFS on 127.0.0.1",
                 ["step", "method", "seconds", "MiB/s", "time vs fastest plain"], rows)
    text += (f"\n\nbuildctl: {s3mod.PART_SIZE // MIB} MiB parts, {s3mod.MAX_CONCURRENCY} parts in flight per store, "
             f"files >= {s3mod.MULTIPART_THRESHOLD // MIB} MiB multipart; pull streams one GET per file, 4 files at once."
             f"\nGoals: publish <= 1.1x ({pub_ratio:.2f}x), pull <= 1.1x ({pull_ratio:.2f}x) the fastest plain tool.")
    text += "".join(f"\n- {n}" for n in notes)
    finish("transfer", text, {"bytes": total, "publish_ratio": round(pub_ratio, 3), "pull_ratio": round(pull_ratio, 3),
                              "goal": 1.1, "met": pub_ratio <= 1.1 and pull_ratio <= 1.1, "notes": notes,
                              "seconds": {**{f"publish: {k}": round(v, 3) for k, v in up.items()},
                                          **{f"pull: {k}": round(v, 3) for k, v in down.items()}}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
