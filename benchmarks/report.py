"""Collect the benchmark results into ``benchmarks/results/latest.md`` and a PNG chart of
throughput against the physical limit."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from benchmarks.common import RESULTS, machine, spread

ORDER = ["hashing", "transfer", "cache", "reconcile", "stage_times", "deep_verify", "activate", "crypto_digest", "verify_read", "install_sizes", "speedgate", "warm_start", "reference_modes", "rollout", "upgrade", "fallback", "fleet_scale"]


def chart(hashing: dict, transfer: dict | None) -> str | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2 if transfer else 1, figsize=(13 if transfer else 7, 4.8), squeeze=False)
    tp = {k: hashing["bytes"] / spread(v)[0] / 2 ** 30 for k, v in hashing["warm_seconds"].items()}  # medians
    names = list(tp)
    ax = axes[0][0]
    colors = ["#1f77b4" if "buildctl" in n else ("#888888" if n.startswith(("raw read", "python read")) else "#ff7f0e")
              for n in names]
    ax.barh(names, [tp[n] for n in names], color=colors)
    ax.axvline(tp["raw read (cat)"], color="black", linestyle="--", linewidth=1, label="raw read (cat)")
    ax.set_xlabel("GiB/s (warm page cache, median of the rounds)")
    ax.set_title("hashing vs the physical limit")
    ax.legend(loc="lower right")
    if transfer:
        secs = {k: spread(v)[0] for k, v in transfer["loopback_seconds"].items()}
        size_mib = transfer["loopback_bytes"] / 2 ** 20
        labels = list(secs)
        ax2 = axes[0][1]
        ax2.barh(labels, [size_mib / secs[k] for k in labels],
                 color=["#1f77b4" if "buildctl" in k else "#ff7f0e" for k in labels])
        ax2.set_xlabel("MiB/s (SeaweedFS on 127.0.0.1, median of the rounds)")
        ax2.set_title("publish and pull vs plain tools")
    fig.tight_layout()
    out = RESULTS / "throughput.png"
    fig.savefig(out, dpi=110)
    return out.name


def measured_on(result: Path) -> str:
    """When a result was measured: its file's last commit date, or "now" for one not committed
    yet (a rerun of one benchmark must not re-date the others)."""
    import subprocess

    try:
        dirty = subprocess.run(["git", "status", "--porcelain", "--", str(result)], capture_output=True, text=True,
                               cwd=RESULTS, timeout=10).stdout.strip()
        date = subprocess.run(["git", "log", "-1", "--format=%cd", "--date=format:%Y-%m-%d %H:%M UTC", "--",
                               str(result)], capture_output=True, text=True, cwd=RESULTS, timeout=10,
                              env={**os.environ, "TZ": "UTC"}).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "at an unknown time (no git)"
    if dirty or not date:
        return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()) + " (not committed yet)"
    return date


def main() -> int:
    parts = [f"# buildctl benchmarks\n\nAssembled {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} from "
             f"the per-benchmark results on {machine()}; each section says when it was measured. Every method "
             "runs at least 5 times, interleaved with the others it is compared with; figures are medians "
             "with the min-max, and ratios are taken per round. Absolute numbers drift on this machine.\n"]
    summaries = {}
    for name in ORDER:
        md, js = RESULTS / f"{name}.md", RESULTS / f"{name}.json"
        if md.exists() and js.exists():
            summaries[name] = json.loads(js.read_text())
            parts.append(f"_{name}: measured {measured_on(js)}_\n\n" + md.read_text())
    if "hashing" in summaries:
        png = chart(summaries["hashing"], summaries.get("transfer"))
        if png:
            parts.append(f"![throughput against the physical limit]({png})\n")
    goals = [f"- {n}: {'met' if s.get('met') else 'NOT met'}" for n, s in summaries.items() if "met" in s]
    parts.append("## Goals\n\n" + "\n".join(goals) + "\n")
    (RESULTS / "latest.md").write_text("\n".join(parts))
    print(f"wrote {RESULTS / 'latest.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
