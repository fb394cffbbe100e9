"""Fleet upgrades, in simulation: what a driver-branch and a TensorRT-LLM upgrade cost a fleet.

    python -m benchmarks.upgrade [--nodes-per-model 64] [--batch 8] [--batch-min 20] [--seeds 20]

The fleet: 3 GPU models (H100, A100, L40S) × ``nodes-per-model`` nodes, each serving one of 3
profiles (round robin), so 9 (GPU model, profile) pairs. Each GPU model is upgraded in rolling
batches of ``batch`` nodes every ``batch-min`` minutes (the models in parallel); the maintenance
itself is the same in every mode and not counted. What each upgrade means for each pair is decided
by buildctl's own code on real fingerprints: a changed compat key is a build, a changed soft field
alone a re-check, nothing a swap (``Fingerprint.compat_key``, ``soft_differences``; with schema-1
keys, ``legacy_compat_key``, which has no soft fields).

Three modes:

* **reactive, schema-1 keys** (before #28, kept for the comparison): the first upgraded node of a
  pair starts its build; one builder per GPU model builds its pairs one after another, then
  validates; a node has no servable engine from its upgrade until its pair's artifact passed;
* **reactive, hard/soft keys**: the same, with a re-check (validation only) where only soft fields
  changed; a node waits for its re-check (as with ``pull --require-covered``);
* **reactive, hard/soft keys, vLLM fallback** (#59): the same, for a served model whose second
  runtime is a validated vLLM bundle of the same weights (``build_profiles/models/``). The bundle's
  own key decides its work (``compat_key("vllm")``: the driver is soft for it, TensorRT-LLM not in it);
  the builder does the bundles' work first (a re-check takes ``--validate-min``, a build
  ``--bundle-build-min``), then the engines'. A node whose engine is not ready serves the bundle as
  soon as the bundle is, and swaps back once the engine is (``pull --model``): a swap each way;
* **planned**: ``upgrade prepare`` re-checks and builds before the first node is touched,
  ``pull --for-upgrade --stage-only`` pre-stages, and ``upgrade ready`` gates each node, so a node
  is without an engine only for ``node activate``'s swap (1 s, the bound ``tests/steps/test_node_agent.py``
  checks). The lead time is how long the preparation took before the first batch may start.

Build times are the field report's "15–45 minutes per build" (8B TP1: 15, 70B TP4: 30, 70B TP8:
45 minutes, on as many GPUs as the TP size); a validation or re-check takes ``--validate-min``
(10 by default: an assumption, the report gives no figure). Each seed draws every build and
validation time uniformly within ±20% of its figure; the table gives the median over seeds and
the range. Nothing is timed: this is a model computed from its parameters.
"""

from __future__ import annotations

import argparse
import random
import statistics
from dataclasses import dataclass

from benchmarks.common import finish, table
from buildctl.engines.fingerprint import CpuInfo, Fingerprint, GpuInfo
from buildctl.steps.upgrade import SWAP_MINUTES

PROFILES = (("llama-8b-tp1", 15.0, 1), ("llama-70b-fp8-tp4", 30.0, 4), ("llama-70b-tp8", 45.0, 8))
GPUS = (("NVIDIA H100 80GB HBM3", "9.0", 81559), ("NVIDIA A100-SXM4-80GB", "8.0", 81920), ("NVIDIA L40S", "8.9", 46068))
SWAP_MIN = SWAP_MINUTES  # node activate of a staged engine: the figure upgrade plan counts
UPGRADES = {
    "driver branch 550 -> 580": {"driver_version": "580.65.06"},
    "TensorRT-LLM 1.2.1 -> 1.2.2": {"tensorrt_llm_version": "1.2.2", "tensorrt_version": "10.14.1.48"},
}


def host(gpu: tuple[str, str, int]) -> Fingerprint:
    name, sm, mem = gpu
    return Fingerprint(gpus=tuple(GpuInfo(name=name, sm=sm, memory_mib=mem) for _ in range(8)),
                       driver_version="550.54.15", cuda_version="12.4", tensorrt_version="10.13.2.6",
                       tensorrt_llm_version="1.2.1", torch_version="2.8.0",
                       cpu=CpuInfo(machine="x86_64", isa_level="x86-64-v4", flags=("avx2", "avx512f")),
                       platform="linux-x86_64", glibc_version="2.35", compiler_version="gcc 11.4.0")


def work_for(before: Fingerprint, after: Fingerprint, legacy: bool, backend: str = "trtllm") -> str:
    """What buildctl does for one pair after the upgrade: build, re-check or nothing."""
    if legacy:
        return "build" if before.legacy_compat_key(backend) != after.legacy_compat_key(backend) else "none"
    if before.compat_key(backend) != after.compat_key(backend):
        return "build"
    return "re-check" if before.soft_differences(after, backend) else "none"


def node_wait(upgraded_at: float, engine_ready: float, fallback_ready: float | None) -> tuple[float, float]:
    """(minutes without a servable runtime, minutes on the fallback) of one node upgraded at
    ``upgraded_at`` whose engine is ready at ``engine_ready`` (0: nothing to do) and whose fallback
    is ready at ``fallback_ready`` (None: no fallback). Swaps included: one, or two via a fallback."""
    if engine_ready <= upgraded_at:
        return SWAP_MIN, 0.0
    if fallback_ready is None or fallback_ready >= engine_ready:
        return engine_ready - upgraded_at + SWAP_MIN, 0.0
    on_fb_from = max(upgraded_at, fallback_ready)
    return on_fb_from - upgraded_at + 2 * SWAP_MIN, engine_ready - on_fb_from


@dataclass
class Result:
    node_minutes: float
    builds: int
    rechecks: int
    build_gpu_hours: float
    lead_min: float
    fallback_node_minutes: float = 0.0


def simulate(upgrade: dict, mode: str, seed: int, nodes_per_model: int, batch: int, batch_min: float,
             validate_min: float, bundle_build_min: float = 5.0) -> Result:
    rng = random.Random(seed)
    node_minutes = gpu_hours = lead = on_fallback = 0.0
    builds = rechecks = 0
    for gpu in GPUS:
        before = host(gpu)
        after = before.model_copy(update=upgrade)
        free = 0.0  # this GPU model's builder (one worker of the new compat key)
        ready: dict[int, float] = {}
        fb_ready: dict[int, float | None] = dict.fromkeys(range(len(PROFILES)))
        if mode == FALLBACK:  # the bundles first: they are what the nodes serve meanwhile
            for p in range(len(PROFILES)):
                work = work_for(before, after, legacy=False, backend="vllm")
                if work == "build":
                    free += bundle_build_min * rng.uniform(0.8, 1.2) + validate_min * rng.uniform(0.8, 1.2)
                    builds += 1
                elif work == "re-check":
                    free += validate_min * rng.uniform(0.8, 1.2)
                    rechecks += 1
                fb_ready[p] = free if work != "none" else 0.0
        for p, (_, build_min, tp) in enumerate(PROFILES):  # all three pairs are triggered by the first batch
            work = work_for(before, after, legacy=mode == "reactive, schema-1 keys")
            took = 0.0
            if work == "build":
                b = build_min * rng.uniform(0.8, 1.2)
                took = b + validate_min * rng.uniform(0.8, 1.2)
                builds += 1
                gpu_hours += b / 60 * tp
            elif work == "re-check":
                took = validate_min * rng.uniform(0.8, 1.2)
                rechecks += 1
            free += took
            ready[p] = free if work != "none" else 0.0
        if mode == "planned":
            lead = max(lead, free)  # the first batch starts once every pair is ready
        for i in range(nodes_per_model):
            upgraded_at = (i // batch) * batch_min
            p = i % len(PROFILES)
            if mode == "planned" or ready[p] == 0.0:
                node_minutes += SWAP_MIN
            else:
                without, fb = node_wait(upgraded_at, ready[p], fb_ready[p])
                node_minutes += without
                on_fallback += fb
    return Result(node_minutes, builds, rechecks, gpu_hours, lead, on_fallback)


FALLBACK = "reactive, hard/soft keys, vLLM fallback"
MODES = ("reactive, schema-1 keys", "reactive, hard/soft keys", FALLBACK, "planned")


def summarize(values: list[float], digits: int = 0) -> str:
    med = statistics.median(values)
    lo, hi = min(values), max(values)
    if lo == hi:
        return f"{med:,.{digits}f}"
    return f"{med:,.{digits}f} [{lo:,.{digits}f}–{hi:,.{digits}f}]"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes-per-model", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8, help="nodes upgraded at a time per GPU model")
    ap.add_argument("--batch-min", type=float, default=20.0, help="minutes between batches")
    ap.add_argument("--validate-min", type=float, default=10.0, help="minutes per validation or re-check (an assumption)")
    ap.add_argument("--bundle-build-min", type=float, default=5.0,
                    help="minutes to build a vLLM bundle where its key changed (an assumption)")
    ap.add_argument("--seeds", type=int, default=20)
    args = ap.parse_args(argv)
    rows, results = [], {}
    for name, upgrade in UPGRADES.items():
        for mode in MODES:
            runs = [simulate(upgrade, mode, seed, args.nodes_per_model, args.batch, args.batch_min, args.validate_min,
                             args.bundle_build_min) for seed in range(args.seeds)]
            results[f"{name} / {mode}"] = {
                "node_minutes_median": round(statistics.median(r.node_minutes for r in runs), 1),
                "node_minutes_range": [round(min(r.node_minutes for r in runs), 1), round(max(r.node_minutes for r in runs), 1)],
                "builds": runs[0].builds, "rechecks": runs[0].rechecks,
                "build_gpu_hours_median": round(statistics.median(r.build_gpu_hours for r in runs), 1),
                "fallback_node_minutes_median": round(statistics.median(r.fallback_node_minutes for r in runs), 1),
                "lead_min_median": round(statistics.median(r.lead_min for r in runs), 1)}
            rows.append([name, mode, summarize([r.node_minutes for r in runs]),
                         summarize([r.fallback_node_minutes for r in runs]), str(runs[0].builds),
                         str(runs[0].rechecks), summarize([r.build_gpu_hours for r in runs], 1),
                         summarize([r.lead_min for r in runs]) if mode == "planned" else ""])
    nodes = args.nodes_per_model * len(GPUS)
    text = table(f"upgrades of {nodes} nodes ({len(GPUS)} GPU models × {args.nodes_per_model}, {len(PROFILES)} profiles), "
                 f"batches of {args.batch} every {args.batch_min:g} min; builds 15/30/45 min, validation "
                 f"{args.validate_min:g} min, ±20%; median [range] over {args.seeds} seeds (a model, not a measurement)",
                 ["upgrade", "mode", "node-minutes without a servable runtime", "node-minutes on a fallback", "builds", "re-checks",
                  "build GPU-hours", "lead time, min"], rows)
    finish("upgrade", text, {"params": vars(args), "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
