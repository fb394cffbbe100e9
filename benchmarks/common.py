"""Shared helpers: engine-like trees, timing, cache dropping, tables and the results file."""

from __future__ import annotations

import json
import os
import platform
import random
import time
from pathlib import Path
from typing import Any, Callable

RESULTS = Path(__file__).resolve().parent / "results"
GIB = 1024 ** 3
MIB = 1024 ** 2


def machine() -> str:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    return f"{os.cpu_count()} cores ({cpu or platform.machine()}), {mem:.0f} GiB RAM, Python {platform.python_version()}"


def make_engine_tree(root: Path, total_bytes: int, seed: int = 0, *, distinct: bool = False) -> Path:
    """An engine-like directory: ~90% in 4 large rank files, the rest in 200 small files.
    ``distinct``: every 8 MiB of the rank files its own random bytes (by default ranks 0 and 2, and
    1 and 3, are equal: a store keeps each pair as one blob)."""
    if (root / ".complete").exists() and json.loads((root / ".complete").read_text()) == total_bytes:
        return root
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    large = int(total_bytes * 0.9) // 4
    small_total = total_bytes - 4 * large
    chunk = os.urandom(8 * MIB)
    for r in range(4):
        with open(root / f"rank{r}.engine", "wb") as f:
            left = large
            while left > 0:
                n = min(left, len(chunk))
                if distinct:
                    f.write(os.urandom(n))
                else:
                    f.write(chunk[:n] if r % 2 == 0 else chunk[::-1][:n])
                left -= n
    per = max(1, small_total // 200)
    (root / "lora").mkdir(exist_ok=True)
    for i in range(200):
        (root / "lora" / f"adapter{i:03d}.bin").write_bytes(rng.randbytes(per))
    (root / "config.json").write_text('{"pretrained_config": {"mapping": {"world_size": 4}}}')
    (root / ".complete").write_text(json.dumps(total_bytes))
    return root


def tree_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != ".complete")


def drop_caches() -> bool:
    """Drop the page cache (root only); False where it is not allowed."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def interleaved(methods: dict[str, Callable[[], Any]], reps: int = 5,
                before: Callable[[str], Any] | None = None) -> dict[str, list[float]]:
    """Seconds of each method over ``reps`` rounds, interleaved (A B C, C B A, A B C, ...) so drift
    on a shared machine hits every method alike; ``before(name)`` runs untimed before each call."""
    names = list(methods)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(reps):
        for n in (names if r % 2 == 0 else names[::-1]):
            if before:
                before(n)
            times[n].append(timed(methods[n])[0])
    return times


def spread(values: list[float]) -> tuple[float, float, float]:
    """Median, min and max."""
    xs = sorted(values)
    mid = len(xs) // 2
    med = xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2
    return med, xs[0], xs[-1]


def fmt_spread(values: list[float], digits: int = 2, unit: str = "") -> str:
    med, lo, hi = spread(values)
    return f"{med:.{digits}f}{unit} ({lo:.{digits}f}-{hi:.{digits}f})"


def round_ratios(times: dict[str, list[float]], method: str, baselines: list[str]) -> list[float]:
    """Per round: ``method``'s time over the fastest baseline's time in that same round."""
    return [times[method][i] / min(times[b][i] for b in baselines) for i in range(len(times[method]))]


def table(title: str, header: list[str], rows: list[list[Any]]) -> str:
    cols = [header] + [[str(c) for c in r] for r in rows]
    w = [max(len(r[i]) for r in cols) for i in range(len(header))]
    lines = [f"### {title}", "", "| " + " | ".join(h.ljust(w[i]) for i, h in enumerate(header)) + " |",
             "|" + "|".join("-" * (x + 2) for x in w) + "|"]
    lines += ["| " + " | ".join(c.ljust(w[i]) for i, c in enumerate(r)) + " |" for r in cols[1:]]
    return "\n".join(lines)


def finish(name: str, text: str, summary: dict[str, Any]) -> None:
    """Print the table and the final JSON line; keep both for the report."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    summary = {"benchmark": name, "machine": machine(), **summary}
    (RESULTS / f"{name}.md").write_text(text + "\n")
    (RESULTS / f"{name}.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    print(text)
    print(json.dumps(summary, sort_keys=True))
