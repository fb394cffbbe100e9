"""Hashing: buildctl's manifest hashing against the physical limit (raw sequential reading of the
same bytes) and against what other artifact tools use (sha256, BLAKE3), warm and cold cache.

    python -m benchmarks.hashing [--size-gib 2] [--dir DIR] [--repeat 3]

Goal: buildctl hashing >= 0.9x raw read throughput.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from buildctl.digest import BUFFER_SIZE
from buildctl.store.manifest import hash_tree, scan_tree
from benchmarks.common import GIB, best_of, drop_caches, finish, make_engine_tree, table, tree_files


def raw_read(files: list[Path]) -> None:
    """The physical limit: cat every file to /dev/null, one after another."""
    subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)


def python_read(files: list[Path]) -> None:
    buf = bytearray(BUFFER_SIZE)
    for p in files:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def hashlib_tree(files: list[Path], factory) -> None:
    buf = bytearray(BUFFER_SIZE)
    view = memoryview(buf)
    for p in files:
        h = factory()
        with open(p, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                h.update(view[:n])
        h.hexdigest()


def blake3_tree(files: list[Path]) -> None:
    import blake3

    def one(p: Path) -> str:
        return blake3.blake3(max_threads=blake3.blake3.AUTO).update_mmap(str(p)).hexdigest()

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(one, files))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-gib", type=float, default=2.0)
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "buildctl-bench-tree")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    size = int(args.size_gib * GIB)
    root = make_engine_tree(args.dir, size)
    files = tree_files(root)
    sources = [f for f in scan_tree(root) if f.path != ".complete"]
    total = sum(p.stat().st_size for p in files)

    methods = {
        "raw read (cat)": lambda: raw_read(files),
        "buildctl manifest hashing (xxh3-128, default threads)": lambda: hash_tree(sources),
        "buildctl manifest hashing (1 thread)": lambda: hash_tree(sources, workers=1),
        "python read loop (no hash)": lambda: python_read(files),
        "sha256 (hashlib)": lambda: hashlib_tree(files, hashlib.sha256),
        "BLAKE3 (b3sum-style, mmap, threads)": lambda: blake3_tree(files),
    }
    cold_ok = drop_caches()
    results: dict[str, dict[str, float]] = {}
    for name, fn in methods.items():
        warm = best_of(args.repeat, fn, before=fn if not results else None)
        cold = best_of(1, fn, before=drop_caches) if cold_ok else float("nan")
        results[name] = {"warm_gib_s": total / warm / GIB, "cold_gib_s": total / cold / GIB if cold_ok else float("nan")}
    base = results["raw read (cat)"]
    fastest_read = max(results["raw read (cat)"]["warm_gib_s"], results["python read loop (no hash)"]["warm_gib_s"])
    rows = []
    for name, r in results.items():
        rows.append([name, f"{r['warm_gib_s']:.2f}", f"{r['warm_gib_s'] / base['warm_gib_s']:.2f}x",
                     f"{r['cold_gib_s']:.2f}" if cold_ok else "n/a",
                     f"{r['cold_gib_s'] / base['cold_gib_s']:.2f}x" if cold_ok else "n/a"])
    ours = results["buildctl manifest hashing (xxh3-128, default threads)"]
    warm_ratio = ours["warm_gib_s"] / base["warm_gib_s"]
    warm_vs_fastest = ours["warm_gib_s"] / fastest_read
    cold_ratio = ours["cold_gib_s"] / base["cold_gib_s"] if cold_ok else None
    text = table(f"hashing {total / GIB:.2f} GiB in {len(files)} files", ["method", "warm GiB/s", "vs raw",
                 "cold GiB/s", "vs raw"], rows)
    text += (f"\n\nGoal: buildctl hashing >= 0.9x raw read. Warm: {warm_ratio:.2f}x of cat "
             f"({warm_vs_fastest:.2f}x of the fastest plain read, a Python readinto loop)"
             + (f", cold: {cold_ratio:.2f}x." if cold_ok else ", cold: not measured (cannot drop caches)."))
    finish("hashing", text, {"bytes": total, "files": len(files), "warm_ratio_vs_raw": round(warm_ratio, 3),
                             "warm_ratio_vs_fastest_read": round(warm_vs_fastest, 3),
                             "cold_ratio_vs_raw": round(cold_ratio, 3) if cold_ratio else None,
                             "goal": 0.9, "met": warm_ratio >= 0.9 and (cold_ratio is None or cold_ratio >= 0.9),
                             "throughput_gib_s": {k: round(v["warm_gib_s"], 3) for k, v in results.items()}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
