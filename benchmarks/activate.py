"""``node activate`` of a staged engine: what the checks before the swap cost, and what they refuse.

    python -m benchmarks.activate [--size-gib 4] [--repeat 5]

An engine-like tree of ``--size-gib`` (4 rank files, 200 small files in ``lora/``) is published
into a local store for the host after an upgrade, promoted to prod, and staged on a node whose
``current`` is another engine (``pull --for-upgrade --stage-only``, as an operator would). Then,
repeated and interleaved:

* **inside the window**: activation as the node does it right after staging: the staged tree's
  shape checked by ``lstat`` against the manifest, every file's stat compared with the one taken
  at the staging's deep verify, no hashing (nothing changed), then the swap;
* **past the window**: the same with the window at 0, so every byte is re-hashed (xxh3-128 and
  BLAKE3), the cost of activating a staging older than 24 h.

Neither runs the backend's preflight (a trtllm engine cannot load here; ``--skip-preflight``): a
preflight adds the backend's load time. Between rounds, ``current`` is put back and the staged
entry restored, untimed. Then each kind of damage is applied to the staged copy in turn and
``buildctl node activate`` is run in-process: the exit code and whether ``current`` moved are
recorded, and the damage is undone before the next.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

from benchmarks.common import GIB, finish, fmt_spread, interleaved, make_engine_tree, spread, table
from buildctl.artifact_store.node.pull import PullOptions

KINDS = ("flip", "flip-keep-mtime", "truncate", "delete", "empty-dir", "add-file", "file-symlink", "dir-symlink")


def _flip(path: Path) -> None:
    """Flip one bit of the byte in the middle of ``path``, in place (twice puts it back)."""
    mid = path.stat().st_size // 2
    with open(path, "r+b") as f:
        f.seek(mid)
        b = f.read(1)
        f.seek(mid)
        f.write(bytes([b[0] ^ 0x40]))


def _damage(engine: Path, kind: str, spare: Path) -> None:
    """Damage the staged copy in place; :func:`_undo` puts it back (the sizes stay 4 GiB)."""
    small = engine / "lora" / "adapter000.bin"
    big = engine / "rank0.engine"
    for p in (engine, engine / "lora", small, big):
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    if kind in ("flip", "flip-keep-mtime"):
        st = big.stat()
        _flip(big)
        if kind == "flip-keep-mtime":
            os.utime(big, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif kind == "truncate":
        shutil.copyfile(small, spare / "small")
        os.truncate(small, small.stat().st_size // 2)
    elif kind == "delete":
        os.rename(small, spare / "small")
    elif kind == "empty-dir":
        os.rename(engine, spare / "engine")
        engine.mkdir()
    elif kind == "add-file":
        (engine / "extra.bin").write_bytes(b"not in the manifest")
    elif kind == "file-symlink":
        os.rename(small, spare / "small")
        os.symlink(spare / "small", small)
    elif kind == "dir-symlink":
        os.rename(engine / "lora", spare / "lora")
        os.symlink(spare / "lora", engine / "lora")


def _undo(engine: Path, kind: str, spare: Path) -> None:
    small = engine / "lora" / "adapter000.bin"
    big = engine / "rank0.engine"
    if kind in ("flip", "flip-keep-mtime"):
        _flip(big)  # flipped back
    elif kind in ("truncate", "delete", "file-symlink"):
        small.unlink(missing_ok=True)
        os.rename(spare / "small", small)
    elif kind == "empty-dir":
        engine.rmdir()
        os.rename(spare / "engine", engine)
    elif kind == "add-file":
        (engine / "extra.bin").unlink()
    elif kind == "dir-symlink":
        (engine / "lora").unlink()
        os.rename(spare / "lora", engine / "lora")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.activate")
    ap.add_argument("--size-gib", type=float, default=4.0)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)

    from buildctl.steps import node_agent
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.artifact_store.node.install_dir import current_artifact
    from buildctl.artifact_store.promotion import promote
    from buildctl.artifact_store.publish import ManifestDraft
    from buildctl.cli.main import run
    from buildctl.steps.context import Context
    from buildctl.core.settings import load_settings
    from tests.support.helpers import publish_files, staged, write_attestation
    from tests.support.trtllm_kit import h100x8

    profile = "llama-3-8b-instruct-fp8-tp1"
    before = h100x8()
    after = before.model_copy(update={"tensorrt_llm_version": "1.2.2", "tensorrt_version": "10.14.1.48"})
    work = Path(tempfile.mkdtemp(prefix="buildctl-bench-activate-"))
    try:
        store = open_store(str(work / "store"))
        ids = {}
        for name, fp, tree in (("a", before, make_engine_tree(work / "small", 1 << 20, seed=1)),
                               ("b", after, make_engine_tree(work / "tree", int(args.size_gib * GIB)))):
            (tree / ".complete").unlink()
            draft = ManifestDraft(profile_name=profile, profile_hash="xxh3-128:" + "0" * 32, backend="trtllm",
                                  compat_key=fp.compat_key("trtllm"), fingerprint=fp.model_dump(mode="json"),
                                  tool_versions={"backend": fp.tool_version("trtllm")}, model_digest=None,
                                  build_key=None)
            ids[name] = publish_files(store, tree, draft, None, verdict=None)
            write_attestation(store, ids[name], fp.compat_key("trtllm"), "pass", validator=fp)
            promote(store, staged(store, ids[name]), "prod")
        fp_file = work / "fp.json"
        fp_file.write_text(json.dumps(after.model_dump(mode="json")))
        os.environ.update({"BUILDCTL_FINGERPRINT_FILE": str(fp_file), "BUILDCTL_STORE": store.uri})
        settings = load_settings(cache_dir=work / "cache")
        ctx = Context.from_settings(settings, store=store)
        dest = work / "node"
        node_agent.pull(ctx.with_fingerprint(before), profile, 'prod', dest, PullOptions(skip_preflight=True, health_check=False))
        node_agent.stage(ctx.with_fingerprint(after), profile, 'prod', dest, None)
        (entry_file,) = (dest / ".buildctl-staged").glob("*.json")
        entry_json = entry_file.read_text()
        a_link = os.readlink(dest / "current")
        engine = dest / "versions" / ids["b"].split(":")[1]
        size = sum(p.stat().st_size for p in engine.rglob("*") if p.is_file())

        def reset(_: str) -> None:
            tmp = dest / ".current-bench"
            os.symlink(a_link, tmp)
            os.replace(tmp, dest / "current")
            entry_file.parent.mkdir(exist_ok=True)
            entry_file.write_text(entry_json)

        def activate(window: float):
            c = Context(ctx.settings, ctx.store, ctx.auth.but(verify_window_s=window))

            def go():
                got = node_agent.activate(c, profile, dest, fingerprint=after, skip_preflight=True)
                assert got.result.installed and current_artifact(dest) == ids["b"], got
            return go

        times = interleaved({"inside the window": activate(86400.0), "past the window": activate(0.0)},
                            reps=args.repeat, before=reset)
        refusals = {}
        spare = work / "spare"
        for kind in KINDS:
            reset(kind)
            spare.mkdir()
            _damage(engine, kind, spare)
            code = run(["node", "activate", "--profile", profile, "--dest", str(dest), "--skip-preflight"])
            refusals[kind] = {"exit": code, "current_unchanged": current_artifact(dest) == ids["a"]}
            _undo(engine, kind, spare)
            shutil.rmtree(spare)
        rows = [[name, fmt_spread(v, 3, " s"),
                 f"{size / GIB / spread(v)[0]:.2f} GiB/s re-hashed" if name == "past the window" else "stat only"]
                for name, v in times.items()]
        text = table(f"node activate of a staged {size / GIB:.1f} GiB engine (no preflight), "
                     f"{args.repeat} interleaved rounds", ["activation", "seconds, median (min-max)", "bytes read"], rows)
        text += "\n\n" + table("damage to the staged copy, then `buildctl node activate`", ["damage", "exit", "current"],
                               [[k, v["exit"], "unchanged" if v["current_unchanged"] else "MOVED"]
                                for k, v in refusals.items()])
        summary = {"bytes": size, "repeat": args.repeat,
                   "seconds": {k: {"median": spread(v)[0], "min": spread(v)[1], "max": spread(v)[2], "all": v}
                               for k, v in times.items()},
                   "refusals": refusals,
                   "under_1s": spread(times["inside the window"])[2] < 1.0,
                   "all_refused": all(v["exit"] == 4 and v["current_unchanged"] for v in refusals.values())}
        finish("activate", text, summary)
        return 0 if summary["all_refused"] else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
