"""The aoti engine against vLLM eager and against vLLM compiled from a verified bundle, in one run.

    python -m benchmarks.reference_modes [--repeat 5]

The tiny aoti engine (build_profiles/tiny-llama-cpu.yaml) and the tiny vLLM bundle of the same
model (build_profiles/tiny-llama-vllm-cpu.yaml) are built into a fresh local store and installed.
Three runners serve the same workload (the aoti profile's: 100 requests of 64 tokens in and 16
out): the aoti engine in this process, vLLM eager in this process (the validation reference as
shipped, ``reference.enforce_eager: true``), and vLLM compiled from the bundle in a child process
(``reference.bundle``). Each side runs with one intra-op thread, as the validator runs them. At
each concurrency (1, 4, 16, 32), repeated ``--repeat`` times: the aoti engine, then each reference,
order alternating round by round; a ratio is the aoti engine's output tok/s over that reference's
in the same round. Reported: the median and range of the per-round ratios against each reference.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from benchmarks.common import finish, fmt_spread, table

REPO = Path(__file__).resolve().parent.parent
LEVELS = (1, 4, 16, 32)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.reference_modes")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)

    from buildctl.steps import build, profiles
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.artifact_store.node.install_dir import install_artifact
    from buildctl.steps.context import Context
    from buildctl.engines.profile import load_profile
    from buildctl.engines.registry import get_backend
    from buildctl.engines.threads import intra_op_threads
    from buildctl.core.settings import load_settings
    from buildctl.validators.reference import VllmRunner
    from buildctl.validators.speed import run_once
    from buildctl.validators.validate import _read_config, _speed_workload

    settings = load_settings()
    aoti_profile = load_profile(REPO / "build_profiles" / "tiny-llama-cpu.yaml")
    vllm_profile = load_profile(REPO / "build_profiles" / "tiny-llama-vllm-cpu.yaml")
    work = Path(tempfile.mkdtemp(prefix="bench-reference-modes-"))
    runners: dict = {}
    try:
        store = open_store(f"file://{work / 'store'}")
        ctx = Context.from_settings(settings, store=store)
        ids = {}
        for name, profile in (("aoti", aoti_profile), ("compiled", vllm_profile)):
            ids[name] = build.build(ctx, profile, workdir=work / f"build-{name}").artifact_id
            install_artifact(store, ids[name], work / name)
        model_dir = profiles.resolve_model(settings, aoti_profile)
        speed = aoti_profile.validation.speed
        prompts = _speed_workload(model_dir, _read_config(model_dir), speed.input_len, speed.num_prompts)
        runners["aoti"] = get_backend("aoti", settings).load(work / "aoti" / "current")
        runners["compiled"] = get_backend("vllm", settings).load(work / "compiled" / "current")
        runners["compiled"].set_threads(1)
        runners["eager"] = VllmRunner(model_dir, aoti_profile.reference)
        ratios: dict[str, dict[int, list[float]]] = {"eager": {c: [] for c in LEVELS}, "compiled": {c: [] for c in LEVELS}}
        tok_s: dict[str, dict[int, list[float]]] = {k: {c: [] for c in LEVELS} for k in ("aoti", "eager", "compiled")}
        with intra_op_threads(1):
            for name in runners:  # warm-up, untimed
                run_once(runners[name], prompts[:8], speed.output_len, 4)
            for r in range(args.repeat):
                order = ("aoti", "eager", "compiled") if r % 2 == 0 else ("compiled", "eager", "aoti")
                for c in LEVELS:
                    got = {name: run_once(runners[name], prompts, speed.output_len, c).output_tok_s for name in order}
                    for name, v in got.items():
                        tok_s[name][c].append(v)
                    for ref in ("eager", "compiled"):
                        ratios[ref][c].append(got["aoti"] / got[ref])
    finally:
        for r in runners.values():
            r.close()
        shutil.rmtree(work, ignore_errors=True)

    rows = [[f"c={c}", fmt_spread(tok_s["aoti"][c], 0), fmt_spread(tok_s["eager"][c], 0),
             fmt_spread(tok_s["compiled"][c], 0), fmt_spread(ratios["eager"][c], 2), fmt_spread(ratios["compiled"][c], 2)]
            for c in LEVELS]
    text = table(f"The tiny aoti engine against vLLM eager and compiled ({args.repeat} interleaved rounds, "
                 f"{speed.num_prompts} requests of {speed.input_len} in / {speed.output_len} out, median (min-max))",
                 ["level", "aoti tok/s", "vLLM eager tok/s", "vLLM compiled tok/s", "aoti / eager", "aoti / compiled"],
                 rows)
    finish("reference_modes", text, {"repeat": args.repeat, "tok_s": {k: {str(c): v for c, v in d.items()} for k, d in tok_s.items()},
                                     "ratios": {k: {str(c): v for c, v in d.items()} for k, d in ratios.items()},
                                     "artifacts": ids})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
