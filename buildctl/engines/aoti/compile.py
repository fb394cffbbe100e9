"""The aoti build step, run in its own subprocess by :mod:`engines.aoti.backend`.

``python -m buildctl.engines.aoti.compile --model DIR --out DIR --record FILE`` exports the two
graphs of a Llama with a KV cache (:mod:`buildctl.engines.aoti.kv_llama`) and compiles each with
AOTInductor, embedding the build record (read from ``--record``) in both packages' metadata:

* ``prefill.pt2``: prompts ``[n, S]`` (``n`` up to ``max_batch_size``, ``S`` from 2 to
  ``max_seq_len``) to the next token's log-probabilities and every position's keys and values;
* ``decode.pt2``: one token per live request against the cache, ``[layers, 2, B, kv_heads, T,
  head_dim]`` with ``T`` from 2 to ``max_seq_len - 1`` (a dynamic length equal to the cache's
  fails the export).

The decode graph is exported on a slice of a full-size cache, ``[layers, 2, max_batch_size,
kv_heads, max_seq_len, head_dim]``: AOTInductor keeps the example's strides, so the runner passes
slices of its own cache of exactly that shape without a copy. It prints progress lines to stdout
(the build log).

The two graphs are exported and compiled in two processes at once: this one does the prefill
graph, a child (``--graph decode``, in the same process group, so the backend's timeout and
memory limit cover it) the decode graph. Each compile is one Python thread and one ``g++`` at a
time, so on two cores the build takes about as long as the slower graph instead of the sum
(docs/builders.md has the measured times). ``engine.json`` is written only when both succeeded.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


GRAPHS = ("prefill", "decode")


def _export(name: str, model_dir: str, record: dict, torch: Any) -> Any:
    """One graph of the model, exported with dynamic batch and length."""
    from torch.export import Dim

    from buildctl.engines.aoti.kv_llama import Decode, EagerKVModel, Prefill

    model = EagerKVModel(model_dir, record["dtype"])
    batch, seq = int(record["max_batch_size"]), int(record["max_seq_len"])
    torch.manual_seed(0)
    with torch.no_grad():
        if name == "prefill":
            n, s = Dim("n", min=1, max=batch), Dim("s", min=2, max=seq)
            return torch.export.export(
                Prefill(model.weights).eval(), (torch.randint(4, 100, (2, 8)), torch.tensor([7, 5])),
                dynamic_shapes={"ids": {0: n, 1: s}, "last": {0: n}}, strict=False)
        cache = torch.zeros(record["cache_shape"], dtype=getattr(torch, record["dtype"]))
        print(f"[aoti] KV cache {list(cache.shape)}: {cache.numel() * cache.element_size() / 2**20:.1f} MiB "
              f"(max_batch_size {batch} x max_seq_len {seq})", flush=True)
        b, t = Dim("b", min=1, max=batch), Dim("t", min=2, max=seq - 1)
        return torch.export.export(
            Decode(model.weights).eval(),
            (torch.randint(4, 100, (2,)), torch.tensor([5, 3]), torch.zeros(2, 6), cache[:, :, :2, :, :6]),
            dynamic_shapes={"tokens": {0: b}, "positions": {0: b}, "mask": {0: b, 1: t}, "cache": {2: b, 4: t}},
            strict=False)


def _compile(name: str, args: argparse.Namespace, record: dict) -> None:
    """Export and compile one graph into ``<out>/<name>.pt2``."""
    t0 = time.monotonic()
    import torch

    ep = _export(name, args.model, record, torch)
    print(f"[aoti] exported {name} in {time.monotonic() - t0:.1f}s", flush=True)
    t1 = time.monotonic()
    configs = {"aot_inductor.precompile_headers": False,
               "aot_inductor.metadata": {"buildctl_record": json.dumps(record, sort_keys=True)}}
    path = Path(args.out) / f"{name}.pt2"
    torch._inductor.aoti_compile_and_package(ep, package_path=str(path), inductor_configs=configs)
    print(f"[aoti] compiled {name}.pt2 ({path.stat().st_size} bytes) in {time.monotonic() - t1:.1f}s", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--record", required=True)
    ap.add_argument("--graph", choices=("both",) + GRAPHS, default="both",
                    help="both (the default) compiles decode in a child process while this one compiles prefill")
    args = ap.parse_args(argv)
    record = json.loads(Path(args.record).read_text())
    t0 = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.graph != "both":
        _compile(args.graph, args, record)
        return 0
    child = subprocess.Popen([sys.executable, "-m", "buildctl.engines.aoti.compile", "--model", args.model,
                              "--out", args.out, "--record", args.record, "--graph", "decode"], stdin=subprocess.DEVNULL)
    try:
        import torch

        print(f"[aoti] torch {torch.__version__}, loading {args.model} as {record['dtype']}; "
              f"prefill here, decode in process {child.pid}", flush=True)
        _compile("prefill", args, record)
    except BaseException:
        child.kill()
        child.wait()
        raise
    rc = child.wait()
    if rc != 0:
        print(f"[aoti] the decode graph's compile exited {rc}", flush=True)
        return rc if rc > 0 else 1
    (out / "engine.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    print(f"[aoti] wrote {out} in {time.monotonic() - t0:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
