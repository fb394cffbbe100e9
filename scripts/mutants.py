#!/usr/bin/env python3
"""``make mutants``: mutation testing of the guard modules with cosmic-ray.

For each guard module listed in ``tests/mutants.toml``: a clone of the
repository (cosmic-ray edits files in place), ``cosmic-ray init``, the operator filter
(``exclude-operators``: mutation operators that model no realistic bug, such as ``*`` to ``<<``),
a baseline run, then ``cosmic-ray exec`` with that module's test selection. Modules run
``--jobs`` at a time, each in its own clone. The score per module (killed / (killed + survived))
and every surviving mutant (operator, line, function, source) go to
``benchmarks/results/mutants.{md,json}``.

    python scripts/mutants.py [--modules a.py,b.py] [--jobs 2] [--cosmic-ray PATH]

cosmic-ray lives in its own environment (``make mutants`` creates ``.mutants-venv``); the tests
run with this repository's ``.venv``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
CONFIG = REPO / "tests" / "mutants.toml"
SELECT = REPO / "scripts" / "mutants_tests.py"
COVERAGE = "coverage==7.18.0"  # outside the lock: only `make mutants` needs it, installed beside cosmic-ray


def coverage_lib(cr_bin: Path) -> Path:
    """coverage.py for the repository's interpreter, in its own folder beside cosmic-ray's environment
    (``pip install --target``: nothing enters .venv or the lock)."""
    lib = cr_bin.parent / "coverage-lib"
    if not (lib / "coverage").is_dir():
        subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-m", "pip", "install", "-q", "--target", str(lib),
                        COVERAGE], check=True)
    return lib


def test_map(module: str, tests: list[str], clone: Path, lib: Path, python: str) -> Path:
    """Which test executes which line of ``module``: the selection once under coverage.py, each test
    its own context (subprocesses too: their coverage starts from ``sitecustomize`` and takes the
    running test's id as its static context), turned into scripts/mutants_tests.py's map."""
    site = clone / ".mutants-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(
        "import os\nif os.getenv('COVERAGE_PROCESS_START'):\n    import coverage\n    coverage.process_startup()\n")
    rc = clone / ".mutants-coveragerc"
    data = clone / ".mutants-cov"
    rc.write_text(f"[run]\nparallel = true\ndata_file = {data}\ninclude = {clone / module}\n"
                  "context = ${MUTANTS_TEST_ID-}\n")
    order = clone / ".mutants-order.json"
    env = {**os.environ, "COVERAGE_PROCESS_START": str(rc), "MUTANTS_ORDER_FILE": str(order),
           "PYTHONPATH": f"{lib}:{site}:{SELECT.parent}"}
    subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "mutants_tests", *tests], cwd=clone,
                   env=env, capture_output=True)
    env.pop("COVERAGE_PROCESS_START")  # the steps below are not measured
    subprocess.run([python, "-m", "coverage", "combine", "--rcfile", str(rc), "-q"], cwd=clone, env=env, check=True,
                   capture_output=True)
    out = clone / ".mutants-map.json"
    subprocess.run([python, str(SELECT), "map", str(data), module, str(order), str(out)], cwd=clone, env=env,
                   check=True)
    return out


def load_config(path: Path = CONFIG) -> dict:
    return tomllib.loads(path.read_text())


def entry_key(module: str, operator: str, source: str) -> tuple[str, str, str]:
    """A survivor's identity across runs: module, operator and the mutated line's text (so a line
    that moves keeps its entry)."""
    return module, operator.removeprefix("core/"), source.strip()


def number_offset(survivor: dict) -> str | None:
    """A NumberReplacer mutant's offset: cosmic-ray makes two of each number literal, +1 then -1
    (``OFFSETS = [+1, -1]`` in cosmic_ray/operators/number_replacer.py), numbered in turn, so the
    occurrence's parity says which. An entry with ``offset`` covers that one only."""
    if survivor["operator"].removeprefix("core/") != "NumberReplacer" or "occurrence" not in survivor:
        return None
    return "+1" if survivor["occurrence"] % 2 == 0 else "-1"


def config_text(module: str, tests: list[str], timeout: float, exclude: list[str], python: str,
                test_map: Path | None = None) -> str:
    command = shlex.join([python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests])  # -k expressions have spaces
    if test_map is not None:  # only the tests that execute the mutated lines (scripts/mutants_tests.py)
        command = shlex.join([python, str(SELECT), "select", str(test_map), module, "--", "-x", "-q", "-p",
                              "no:cacheprovider", *tests])
    return "\n".join([
        "[cosmic-ray]", f'module-path = "{module}"', f"timeout = {timeout}", "excluded-modules = []",
        f"test-command = {json.dumps(command)}", "", "[cosmic-ray.distributor]", 'name = "local"', "",
        "[cosmic-ray.filters.operators-filter]", f"exclude-operators = {json.dumps(exclude)}", ""])


def run_module(module: str, spec: dict, exclude: list[str], cr_bin: Path, work: Path, budget_min: float,
               narrow: bool = True) -> dict:
    """One module's run: counts and survivors (:func:`annotate` marks and scores them)."""
    t0 = time.monotonic()
    clone = work / module.replace("/", "_")
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    cfg, db = clone / "cr.toml", clone / "cr.sqlite"
    python = str(REPO / ".venv" / "bin" / "python")
    cfg.write_text(config_text(module, spec["tests"], 600.0, exclude, python))
    cr = str(cr_bin / "cosmic-ray")
    subprocess.run([cr, "init", str(cfg), str(db)], cwd=clone, check=True, capture_output=True)
    subprocess.run([str(cr_bin / "cr-filter-operators"), str(db), str(cfg)], cwd=clone, check=True, capture_output=True)
    t_base = time.monotonic()
    base = subprocess.run([cr, "baseline", str(cfg)], cwd=clone, capture_output=True, text=True)
    baseline_s = time.monotonic() - t_base
    if base.returncode != 0:
        return {"module": module, "error": "baseline failed: the tests fail without any mutation",
                "output": (base.stdout + base.stderr)[-2000:]}
    # A mutant that hangs (a loop that never ends) is killed by the timeout; waiting the default
    # two minutes for each made hangs most of a module's run. Four times the unmutated selection's
    # own time (at least 20 s) leaves room for a busy machine.
    timeout = float(spec.get("timeout", max(20.0, 4 * baseline_s)))
    mapping = test_map(module, spec["tests"], clone, coverage_lib(cr_bin), python) if narrow else None
    cfg.write_text(config_text(module, spec["tests"], timeout, exclude, python, mapping))
    budget = float(spec.get("budget_min", budget_min)) * 60
    stopped = False
    try:  # a module's time budget: what is left is reported as not run
        subprocess.run([cr, "exec", str(cfg), str(db)], cwd=clone, capture_output=True, timeout=budget)
    except subprocess.TimeoutExpired:
        stopped = True
    return read_clone(module, spec, clone, cr_bin, seconds=time.monotonic() - t0, stopped=stopped,
                      baseline_s=baseline_s, timeout=timeout)


def read_clone(module: str, spec: dict, clone: Path, cr_bin: Path, *, seconds: float, stopped: bool,
               baseline_s: float | None, timeout: float | None) -> dict:
    """A module's counts and survivors from its clone's cosmic-ray database (also of a run that was
    interrupted: ``--collect``, whose pending mutants count as not run)."""
    cr = str(cr_bin / "cosmic-ray")
    dump = subprocess.run([cr, "dump", str(clone / "cr.sqlite")], cwd=clone, capture_output=True, text=True,
                          check=True).stdout
    # the committed source: an interrupted run may leave its last mutant applied to the working copy
    source = subprocess.run(["git", "show", f"HEAD:{module}"], cwd=clone, capture_output=True, text=True,
                            check=True).stdout.splitlines()
    counts = {"killed": 0, "survived": 0, "skipped": 0, "incompetent": 0, "pending": 0}
    survivors = []
    timeouts = 0
    for line in dump.splitlines():
        item, result = json.loads(line)
        if result is None:
            counts["pending"] += 1
            continue
        if result["worker_outcome"] == "skipped":
            counts["skipped"] += 1
        elif result["worker_outcome"] != "normal":
            counts["incompetent"] += 1  # the mutant could not run (an exception in cosmic-ray, a timeout counts as killed)
        elif result["test_outcome"] == "survived":
            counts["survived"] += 1
            m = item["mutations"][0]
            row = m["start_pos"][0]
            op = m["operator_name"].removeprefix("core/")
            survivors.append({"operator": op, "line": row,
                              "function": m.get("definition_name"), "occurrence": m["occurrence"],
                              "source": source[row - 1].strip() if 0 < row <= len(source) else ""})
        else:
            counts["killed"] += 1
            if (result.get("output") or "").strip() == "timeout":  # cosmic-ray's word for a test run it killed
                timeouts += 1
    return {"timeouts": timeouts, "module": module, "tests": spec["tests"], **counts, "survivors": survivors, "seconds": round(seconds, 1),
            "stopped_at_budget": stopped,
            "baseline_s": round(baseline_s, 1) if baseline_s is not None else None,
            "timeout_s": round(timeout, 1) if timeout is not None else None,
            "finished_at": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}


# #51 moved modules into rooms without changing their code (imports aside): a run from before the
# move reads as the module's run under its new path, and the report says it predates the move.
MOVED_51 = {
    "buildctl/artifact_store/attestations.py": "buildctl/artifact_store/trust/attestations.py",
    "buildctl/artifact_store/authority.py": "buildctl/artifact_store/trust/authority.py",
    "buildctl/artifact_store/backend.py": "buildctl/artifact_store/backends/store.py",
    "buildctl/artifact_store/binding.py": "buildctl/artifact_store/trust/binding.py",
    "buildctl/artifact_store/checkpoints.py": "buildctl/artifact_store/node/checkpoints.py",
    "buildctl/artifact_store/download.py": "buildctl/artifact_store/node/download.py",
    "buildctl/artifact_store/export_signature.py": "buildctl/artifact_store/node/export_signature.py",
    "buildctl/artifact_store/install_dir.py": "buildctl/artifact_store/node/install_dir.py",
    "buildctl/artifact_store/integrity.py": "buildctl/artifact_store/upkeep/integrity.py",
    "buildctl/artifact_store/inventory.py": "buildctl/artifact_store/fleet/inventory.py",
    "buildctl/artifact_store/listing.py": "buildctl/artifact_store/backends/listing.py",
    "buildctl/artifact_store/local.py": "buildctl/artifact_store/backends/local.py",
    "buildctl/artifact_store/memo.py": "buildctl/artifact_store/backends/memo.py",
    "buildctl/artifact_store/pools.py": "buildctl/artifact_store/backends/pools.py",
    "buildctl/artifact_store/provenance.py": "buildctl/artifact_store/trust/provenance.py",
    "buildctl/artifact_store/pull.py": "buildctl/artifact_store/node/pull.py",
    "buildctl/artifact_store/ranged.py": "buildctl/artifact_store/backends/ranged.py",
    "buildctl/artifact_store/rehash.py": "buildctl/artifact_store/upkeep/rehash.py",
    "buildctl/artifact_store/repair.py": "buildctl/artifact_store/upkeep/repair.py",
    "buildctl/artifact_store/revocation.py": "buildctl/artifact_store/trust/revocation.py",
    "buildctl/artifact_store/rollout.py": "buildctl/artifact_store/fleet/waves.py",
    "buildctl/artifact_store/s3.py": "buildctl/artifact_store/backends/s3.py",
    "buildctl/artifact_store/signing.py": "buildctl/artifact_store/trust/signing.py",
    "buildctl/artifact_store/trust.py": "buildctl/artifact_store/node/admission.py",
    "buildctl/artifact_store/verify.py": "buildctl/artifact_store/read.py",
    "buildctl/context.py": "buildctl/steps/context.py",
    "buildctl/coverage.py": "buildctl/steps/coverage.py",
    "buildctl/digest.py": "buildctl/core/digest.py",
    "buildctl/errors.py": "buildctl/core/errors.py",
    "buildctl/fleet.py": "buildctl/steps/fleet.py",
    "buildctl/healing.py": "buildctl/steps/healing.py",
    "buildctl/logtail.py": "buildctl/core/logtail.py",
    "buildctl/node_agent.py": "buildctl/steps/node_agent.py",
    "buildctl/node_index.py": "buildctl/steps/node_index.py",
    "buildctl/pipeline.py": "buildctl/steps/pipeline.py",
    "buildctl/records.py": "buildctl/core/records.py",
    "buildctl/rollouts.py": "buildctl/steps/rollouts.py",
    "buildctl/settings.py": "buildctl/core/settings.py",
    "buildctl/stats.py": "buildctl/core/stats.py",
    "buildctl/times.py": "buildctl/core/times.py",
    "buildctl/upgrade.py": "buildctl/steps/upgrade.py",
    "buildctl/validate_process.py": "buildctl/steps/validate_process.py",
    "buildctl/worker_queues.py": "buildctl/steps/worker_queues.py",
}


def _normalise(r: dict) -> dict:
    """Results written before the equivalent table existed read as having none; module paths from
    before the package folders moved under buildctl/, and from before #51's rooms, read as their
    paths now."""
    if not r["module"].startswith("buildctl/"):
        r["module"] = "buildctl/" + r["module"]
    if r["module"] in MOVED_51:
        r["moved_from"] = r["module"]
        r["module"] = MOVED_51[r["module"]]
    if "error" not in r:
        r.setdefault("equivalent", 0)
        for x in r.get("survivors", []):
            x.setdefault("equivalent", None)
    return r


def annotate(results: list[dict], conf: dict) -> list[dict]:
    """Mark each survivor with the current tables: its equivalence reason, or the test written
    since the run that kills it (applied by hand); recount and rescore."""
    def table(name: str, field: str) -> dict:
        return {(*entry_key(e["module"], e["operator"], e["source"]), e.get("offset")): e[field]
                for e in conf.get(name, [])}

    def lookup(entries: dict, key: tuple, offset: str | None) -> str | None:
        return entries.get((*key, offset)) or entries.get((*key, None))

    equivalent, killed_since = table("equivalent", "why"), table("killed_since", "test")
    for r in results:
        if "error" in r:
            continue
        matched = set()
        for x in r["survivors"]:
            key, offset = entry_key(r["module"], x["operator"], x["source"]), number_offset(x)
            matched.update({(*key, offset), (*key, None)})
            x["equivalent"] = lookup(equivalent, key, offset)
            x["killed_since"] = None if x["equivalent"] else lookup(killed_since, key, offset)
        r["stale_entries"] = sorted(f"{op}{f' {off}' if off else ''}: `{src}`"
                                    for (mod, op, src, off) in {*equivalent, *killed_since}
                                    if mod == r["module"] and (mod, op, src, off) not in matched)
        r["equivalent"] = sum(1 for x in r["survivors"] if x["equivalent"])
        r["killed_since"] = sum(1 for x in r["survivors"] if x.get("killed_since"))
        tested = r["killed"] + r["survived"] - r["equivalent"]
        r["score"] = r["killed"] / tested if tested else None
        r["score_since"] = (r["killed"] + r["killed_since"]) / tested if tested else None
    return results


def report(results: list[dict], exclude: list[str]) -> str:
    results = [_normalise(r) for r in results]
    lines = ["### Mutation testing of the guard modules (cosmic-ray)", "",
             "`make mutants` (scripts/mutants.py) runs cosmic-ray 8.7 over each guard module in its own clone of the "
             "repository, with that module's test selection from `[modules]` in tests/mutants.toml "
             "(its own fast tests first, then the slower ones), `pytest -x`, and a per-mutant timeout of four times "
             "the unmutated selection's time (at least 20 s); two modules at a time. `make faults` runs it; CI does not.", "",
             "Since 2026-12-05 each mutant runs only the tests of its selection that execute the lines it changed "
             "(scripts/mutants_tests.py: the selection once under coverage.py, one context per test, subprocesses "
             "included); a line that runs at import (outside every function body) or that no test executed runs "
             "the whole selection. On `buildctl/validators/parity.py` both ways left the same 12 survivors "
             "(`--whole-selection` runs the old way).", "",
             f"Operators left out as no realistic bug: `{'`, `'.join(exclude)}`. Score = killed / (killed + survived, "
             "less the survivors marked equivalent); a mutant that made the tests time out counts as killed. "
             "*Not run*: left when the module's time budget ran out. Every survivor is listed below: *equivalent* "
             "with the one-line reason from `[[equivalent]]` in tests/mutants.toml (no test can tell it from the "
             "original: a speed or parallelism choice, a default no caller uses, a bare `*` cosmic-ray \"mutates\" "
             "into the same code; where the reason is only that tests run as root or that a timing coincides, it "
             "says so), or *open*.", "",
             "*Killed since*: a survivor that a test written after the module's last run kills (the test was "
             "applied to that mutant by hand and failed; `[[killed_since]]` names it); the "
             "last column counts them as killed, the score column does not.", "",
             "| module | first tests of its selection | mutants run | killed | survived | of them equivalent | score "
             "| filtered out | not run | timeout (s) | minutes | run (UTC) | with the tests since |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| `{r['module']}` | - | - | - | - | - | {r['error']} | - | - | - | - | - | - |")
            continue
        tested = r["killed"] + r["survived"]
        score = f"{100 * r['score']:.1f}%" if r["score"] is not None else "-"
        first = next((t for t in r.get("tests", []) if t.startswith("tests/")), "-")
        lines.append(f"| `{r['module']}` | `{first}` | {tested} | {r['killed']}"
                     + (f" ({r['timeouts']} by timeout)" if r.get("timeouts") else "")
                     + f" | {r['survived']} | {r['equivalent']} | "
                     f"{score} | {r['skipped']} | {r['incompetent'] + r['pending']} | {r.get('timeout_s') or '-'} | "
                     f"{r['seconds'] / 60:.1f} | {r.get('finished_at', '-')} | "
                     + (f"{100 * r['score_since']:.1f}% |" if r.get("score_since") is not None else "- |"))
    notes = [f"- `{r['module']}`: {r['resumed']}." for r in results if r.get("resumed")]
    notes += [f"- `{r['module']}`: run as `{r['moved_from']}`, before #51 moved it into its room (the code moved "
              "unchanged but for its imports)." for r in results if r.get("moved_from")]
    if notes:
        lines += [""] + notes
    for r in results:
        if r.get("stale_entries"):
            lines += ["", f"Entries for `{r['module']}` in tests/mutants.toml that matched no survivor of its last run "
                      "(the mutant was killed, or its line changed since):", ""]
            lines += [f"- {e}" for e in r["stale_entries"]]
        if r.get("survivors"):
            lines += ["", f"Survivors in `{r['module']}`:", ""]
            lines += [f"- line {s['line']} (`{s['function']}`), {s['operator']}"
                      f"{f' {number_offset(s)}' if number_offset(s) else ''}: `{s['source']}`"
                      + (f": equivalent, {s['equivalent']}" if s["equivalent"] else
                         f": killed since by `{s['killed_since']}`" if s.get("killed_since") else ": open")
                      for s in r["survivors"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--modules", default=None, help="comma-separated module paths (default: every one configured)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--budget-min", type=float, default=40.0, help="minutes per module; the rest is reported as not run")
    ap.add_argument("--cosmic-ray", default=str(REPO / ".mutants-venv" / "bin"), help="directory of the cosmic-ray executables")
    ap.add_argument("--collect", default=None, metavar="DIR",
                    help="read the clones an interrupted run left in DIR (its buildctl-mutants-* folder; copy it "
                         "before stopping the run) and merge them into the results: pending mutants are not run")
    ap.add_argument("--minutes", type=float, default=None, help="with --collect: how long the run ran")
    ap.add_argument("--whole-selection", action="store_true",
                    help="run each mutant against the module's whole selection, not only the tests that execute its lines")
    ap.add_argument("--report-only", action="store_true",
                    help="re-render benchmarks/results/mutants.md from mutants.json with the current equivalent table")
    args = ap.parse_args(argv)
    conf = load_config()
    if args.report_only:
        results = annotate([_normalise(r) for r in json.loads((RESULTS / "mutants.json").read_text())], conf)
        (RESULTS / "mutants.json").write_text(json.dumps(results, indent=2) + "\n")
        (RESULTS / "mutants.md").write_text(report(results, conf["exclude-operators"]))
        print(report(results, conf["exclude-operators"]))
        return 0
    modules = conf["modules"]
    if args.collect:
        got = []
        for clone in sorted(Path(args.collect).iterdir()):
            module = next((m for m in modules if m.replace("/", "_") == clone.name), None)
            if module is None or not (clone / "cr.sqlite").exists():
                continue
            r = read_clone(module, modules[module], clone, Path(args.cosmic_ray), seconds=60 * (args.minutes or 0),
                           stopped=True, baseline_s=None, timeout=None)
            r["resumed"] = f"collected from an interrupted run: {r['pending']} mutants not run"
            got.append(r)
        return _merge_and_report(annotate(got, conf), conf, modules)
    chosen = args.modules.split(",") if args.modules else list(modules)
    unknown = [m for m in chosen if m not in modules]
    if unknown:
        print(f"not configured in tests/mutants.toml [modules]: {', '.join(unknown)}")
        return 2
    partial = RESULTS / "mutants.partial.jsonl"  # each module's result as soon as it is done
    RESULTS.mkdir(parents=True, exist_ok=True)
    partial.write_text("")

    def one(m: str) -> dict:
        (r,) = annotate([run_module(m, modules[m], conf["exclude-operators"], Path(args.cosmic_ray), Path(tmp),
                                    args.budget_min, not args.whole_selection)], conf)
        with partial.open("a") as f:
            f.write(json.dumps(r) + "\n")
        return r

    with tempfile.TemporaryDirectory(prefix="buildctl-mutants-") as tmp, ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(one, chosen))
    partial.unlink()
    if args.modules:  # a partial run: keep the other modules' results
        return _merge_and_report(results, conf, modules)
    return _write(annotate(results, conf), conf)


def _merge_and_report(results: list[dict], conf: dict, modules: dict) -> int:
    RESULTS.mkdir(parents=True, exist_ok=True)
    if (RESULTS / "mutants.json").exists():
        ran = {r["module"] for r in results}
        kept = [r for r in map(_normalise, json.loads((RESULTS / "mutants.json").read_text())) if r["module"] not in ran]
        order = list(modules)
        results = sorted(kept + results, key=lambda r: order.index(r["module"]) if r["module"] in order else len(order))
    return _write(annotate(results, conf), conf)


def _write(results: list[dict], conf: dict) -> int:
    RESULTS.mkdir(parents=True, exist_ok=True)
    text = report(results, conf["exclude-operators"])
    (RESULTS / "mutants.md").write_text(text)
    (RESULTS / "mutants.json").write_text(json.dumps(results, indent=2) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
