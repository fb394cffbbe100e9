"""Fleet-wide store operations at 1k, 10k and 100k nodes: requests, seconds and growth order,
read from every node record (a store before the node index) and from the node index.

    python -m benchmarks.fleet_scale [--nodes 1000,10000,100000] [--stores local,s3] [--reps 3]
        [--s3-max-nodes 10000] [--modes records,index] [--name fleet_scale] [--work DIR]

The store is seeded with 1 profile on 24 compat keys, one base and one target artifact per key
(48), a rollout in progress on every prod ref (waves 1, 10, 50, 100; a day's bake, so the tick
decides "wait" and writes nothing), and N node records of real shape: each on one of the 24
keys, with its engine state on prod (healthy on the target inside the first wave, else on the
base) and the markers its record implies. Records and markers are written directly, 32 at a
time (a node report would write the same keys one node at a time).

Each operation runs ``--reps`` times per mode, interleaved (records, index, index, records, ...),
through ``benchmarks.counting.CountingStore`` (S3's list pages of 1,000). "s3" is SeaweedFS on
127.0.0.1 (``weed mini``), up to ``--s3-max-nodes`` (default 10,000: seeding 100,000 nodes there
writes about a million objects, a record and about 9 markers per node: 53 minutes on 2 cores). Requests are exact; seconds are medians with min-max. The growth order is the exponent of requests between the smallest and the largest N. "at 10-30 ms" extrapolates
the request count to real S3 latencies, one request at a time. ``--modes index`` measures the
index alone (the records' request counts are exact on any store: take them from a local run), and
``--name`` writes the results under another name: the SeaweedFS run at 100,000 nodes is
``--nodes 100000 --stores s3 --s3-max-nodes 100000 --modes index --name fleet_scale_s3_100k``.
``--work DIR`` keeps the seeded stores in DIR and measures a store seeded there before again
without seeding it (SeaweedFS restarts on its data), so a change can be measured at 100,000
nodes without another hour of seeding.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.common import finish, fmt_spread, spread, table
from benchmarks.counting import CountingStore
from buildctl.artifact_store.channels import ChannelMove
from buildctl.artifact_store.gc import GcPolicy

REPO = Path(__file__).resolve().parent.parent
PROFILE = "tiny-llama-cpu"
KEYS = 24
OPERATIONS = ("rollout status --compat-key", "rollout tick", "driver-upgrade reconcile", "gc --dry-run")


def seed(store, work: Path, n: int):
    """Seed ``store``; returns (profiles, compat keys, context)."""
    from buildctl.artifact_store.fleet.inventory import EngineState, NodeRecord
    from buildctl.artifact_store.layout import node_key
    from buildctl.artifact_store.promotion import promote
    from buildctl.artifact_store.fleet.waves import RolloutPlan, in_wave, parse_waves
    from buildctl.core.digest import canonical_json
    from buildctl.engines.fingerprint import detect
    from buildctl.engines.profile import load_profile
    from buildctl.engines.registry import backend_names
    from buildctl.steps.node_index import node_markers, rebuild
    from buildctl.steps.build import manifest_draft
    from buildctl.core.times import utc_now
    from tests.support.helpers import publish_files, staged

    profile = load_profile(REPO / "build_profiles" / f"{PROFILE}.yaml")
    base_fp = detect()
    fps = [base_fp.model_copy(update={"torch_version": f"{base_fp.torch_version}.k{k}"}) for k in range(KEYS)]
    keys, pairs = [], []
    for k, fp in enumerate(fps):
        draft = manifest_draft(profile, fp)
        base = publish_files(store, work / f"base{k}", draft, {"config.json": f"base {k}".encode(), "rank0.engine": 4096}, seed=k)
        target = publish_files(store, work / f"target{k}", draft, {"config.json": f"target {k}".encode(), "rank0.engine": 4096}, seed=100 + k)
        promote(store, staged(store, base), "prod")
        rec = promote(store, staged(store, target), "prod",
                      move=ChannelMove(rollout=RolloutPlan(waves=parse_waves("1,10,50,100", "1%"), bake_s=86400)))
        keys.append(draft.compat_key)
        pairs.append((base, target, rec.seq))
    when = utc_now()
    dumped = [fp.model_dump(mode="json") for fp in fps]
    compat = [{b: fp.compat_key(b) for b in backend_names()} for fp in fps]

    def write(i: int) -> None:
        k = i % KEYS
        node_id = f"node-{i:06d}"
        base, target, seq = pairs[k]
        mine = target if in_wave(PROFILE, "prod", node_id, 1) else base
        state = EngineState(profile=PROFILE, channel="prod", compat_key=keys[k], artifact_id=mine, seq=seq,
                            status="healthy", current=mine, previous=base if mine == target else None, when=when)
        rec = NodeRecord(node_id=node_id, fingerprint=dumped[k], compat_keys=compat[k], profiles=(PROFILE,),
                         reported_at=when, engines=(state,))
        for key in node_markers(rec):
            store.put_bytes(key, b"")
        store.cas(node_key(node_id), canonical_json(rec.model_dump(mode="json")), None)

    with ThreadPoolExecutor(32) as pool:
        list(pool.map(write, range(n)))
    rebuild(store)  # writes the index's meta marker (every marker is already there)
    return {PROFILE: profile}, keys, _context(store, work)


def _context(store, work: Path):
    """The operations' context on ``store``, its cache under ``work``."""
    from buildctl.steps.context import Context
    from buildctl.core.settings import load_settings

    return Context.from_settings(load_settings(cache_dir=work / "cache", store=store.uri), store=store)


def seeded_store(work: Path, kind: str, n: int, server):
    """(profiles, keys, context, store, seconds seeding): a store seeded in ``work`` before (its
    ``seeded-<kind>-<n>.json`` names it) is reused, else one is seeded and recorded there."""
    import json
    import time

    from buildctl.artifact_store.backends.store import open_store
    from buildctl.engines.profile import load_profile

    done = work / f"seeded-{kind}-{n}.json"
    if done.exists():
        got = json.loads(done.read_text())
        store = open_store(got["uri"])
        print(f"{kind} {n}: reusing the store seeded in {got['seed_s']:.0f} s", flush=True)
        return ({PROFILE: load_profile(REPO / "build_profiles" / f"{PROFILE}.yaml")}, got["keys"],
                _context(store, work / f"seed-{kind}-{n}"), store, got["seed_s"])
    uri = str(work / f"store-{n}") if kind == "local" else f"s3://{server.new_bucket()}/fleet"
    store = open_store(uri)
    t0 = time.perf_counter()
    profiles, keys, ctx = seed(store, work / f"seed-{kind}-{n}", n)
    seeded = round(time.perf_counter() - t0, 1)
    print(f"{kind} {n}: seeded in {seeded:.0f} s", flush=True)
    done.write_text(json.dumps({"uri": uri, "keys": keys, "seed_s": seeded}))
    return profiles, keys, ctx, store, seeded


def operations(ctx, profiles, keys):
    from buildctl.steps import fleet
    from buildctl.steps import rollouts
    from buildctl.artifact_store.gc import gc

    now = datetime.now(timezone.utc)
    return {
        "rollout status --compat-key": lambda s: rollouts.status(s, PROFILE, "prod", keys[0]),
        "rollout tick": lambda s: rollouts.tick(ctx.with_store(s), channel="prod", profile=PROFILE, now=now),
        "driver-upgrade reconcile": lambda s: fleet.fleet_plan(s, profiles, only_profiles=[PROFILE]),
        "gc --dry-run": lambda s: gc(s, GcPolicy(grace_s=0), dry_run=True, now=now),
    }


MODES = ("records", "index")


def measure(store, ops: dict, reps: int, modes: tuple[str, ...] = MODES) -> dict[str, dict[str, dict]]:
    """Per operation and mode: requests (exact) and seconds per repetition, interleaved."""
    import time

    from buildctl.artifact_store.layout import NODE_INDEX_META

    meta = store.get_bytes(NODE_INDEX_META)
    out: dict[str, dict[str, dict]] = {op: {m: {"requests": None, "seconds": []} for m in MODES}
                                       for op in ops}
    for r in range(reps):
        for mode in (modes if r % 2 == 0 else tuple(reversed(modes))):
            if mode == "records":
                store.delete(NODE_INDEX_META)
            elif store.stat(NODE_INDEX_META) is None:
                store.put_bytes(NODE_INDEX_META, meta)
            for op, fn in ops.items():
                counted = CountingStore(store)
                t0 = time.perf_counter()
                fn(counted)
                out[op][mode]["seconds"].append(time.perf_counter() - t0)
                out[op][mode]["requests"] = counted.total()
                print(f"  rep {r + 1} {mode}: {op}: {counted.total()} requests, {out[op][mode]['seconds'][-1]:.2f} s", flush=True)
    if store.stat(NODE_INDEX_META) is None:
        store.put_bytes(NODE_INDEX_META, meta)
    return out


def growth(points: dict[int, float]) -> str:
    ns = sorted(points)
    if len(ns) < 2 or points[ns[0]] <= 0:
        return "-"
    exponent = math.log(points[ns[-1]] / points[ns[0]]) / math.log(ns[-1] / ns[0])
    return f"N^{exponent:.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.fleet_scale")
    ap.add_argument("--nodes", default="1000,10000,100000")
    ap.add_argument("--stores", default="local,s3")
    ap.add_argument("--s3-max-nodes", type=int, default=10_000, help="Larger N run on the local store only.")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="Keep the seeded stores (removed by default).")
    ap.add_argument("--work", default=None,
                    help="Work folder to keep and reuse: a store seeded there before (same N and store kind) "
                         "is measured again without seeding (100,000 nodes on SeaweedFS seed in about 53 minutes).")
    ap.add_argument("--modes", default="records,index",
                    help="records, index or both; 'index' alone skips reading every node record "
                         "(100,000 nodes on SeaweedFS: about 6 minutes a call from the records)")
    ap.add_argument("--name", default="fleet_scale", help="the results' file name under benchmarks/results/")
    args = ap.parse_args(argv)
    modes = tuple(m for m in MODES if m in args.modes.split(","))

    sizes = [int(x) for x in args.nodes.split(",")]
    kinds = [x.strip() for x in args.stores.split(",") if x.strip()]
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="buildctl-bench-fleet-"))
    work.mkdir(parents=True, exist_ok=True)
    keep = args.keep or args.work is not None
    server = None
    if "s3" in kinds:
        from tests.support.s3server import SeaweedServer

        server = SeaweedServer(work / "weed").start()
        os.environ.update(server.env())
    results: dict[str, dict[int, dict]] = {}
    try:
        for kind in kinds:
            for n in sizes:
                if kind == "s3" and n > args.s3_max_nodes:
                    continue
                profiles, keys, ctx, store, seeded = seeded_store(work, kind, n, server)
                res = measure(store, operations(ctx, profiles, keys), args.reps, modes)
                results.setdefault(kind, {})[n] = {"seed_s": seeded, "ops": res}
    finally:
        if server is not None:
            server.stop()
        if not keep:
            shutil.rmtree(work, ignore_errors=True)  # a 100,000-node run leaves about 600 MB
        else:
            print(f"seeded stores kept in {work}", flush=True)

    text = [f"Fleet-wide operations against a seeded store (1 profile, {KEYS} compat keys, 48 artifacts, "
            f"{KEYS} prod refs each with a rollout in progress); {args.reps} repetitions per mode, interleaved; "
            "seconds: median (min-max); requests: exact, S3 list pages of 1,000."]
    summary: dict = {"nodes": sizes, "reps": args.reps, "stores": {}}
    for kind, by_n in results.items():
        rows = []
        ns = sorted(by_n)
        for op in OPERATIONS:
            req = {m: {n: by_n[n]["ops"][op][m]["requests"] for n in ns} for m in ("records", "index")}
            for n in ns:
                rec, idx = by_n[n]["ops"][op]["records"], by_n[n]["ops"][op]["index"]
                if not idx["seconds"]:
                    continue
                share = idx["requests"] / rec["requests"] if rec["requests"] else float("nan")
                rows.append([op, f"{n:,}", f"{rec['requests']:,}" if rec["seconds"] else "not run",
                             fmt_spread(rec["seconds"], 2) if rec["seconds"] else "-",
                             f"{idx['requests']:,}", fmt_spread(idx["seconds"], 3), f"{100 * share:.2f}%" if rec["seconds"] else "-",
                             f"{spread(idx['seconds'])[0] / n * 1e6:.2f}",
                             f"{idx['requests'] * 0.01:.1f}-{idx['requests'] * 0.03:.1f} s"])
            if len(ns) > 1:
                rows.append([f"{op}: growth", "", growth({n: r for n, r in req["records"].items() if r}), "",
                             growth(req["index"]), "", "", "", ""])
        text.append(table(f"{'SeaweedFS (127.0.0.1)' if kind == 's3' else 'local directory'}",
                          ["operation", "nodes", "requests, records", "seconds, records", "requests, index",
                           "seconds, index", "index/records", "µs per node, index", "index at 10-30 ms/request"],
                          rows))
        summary["stores"][kind] = {str(n): {"seed_s": by_n[n]["seed_s"], **{
            op: {m: {"requests": by_n[n]["ops"][op][m]["requests"], "seconds_median": spread(by_n[n]["ops"][op][m]["seconds"])[0],
                     "seconds": [round(x, 4) for x in by_n[n]["ops"][op][m]["seconds"]]}
                 for m in modes}
            for op in OPERATIONS}} for n in ns}
    summary["modes"] = list(modes)
    finish(args.name, "\n\n".join(text), summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
