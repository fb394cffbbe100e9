"""Shared logic of the fake TensorRT-LLM tools (tests only; no GPU, no TensorRT).

Every fake first parses its argv against the contract fixture of the release it acts as
(``FAKE_TRTLLM_VERSION``, default 1.2.1; see ``contract.py``): an unknown flag or value exits 2
with argparse's message, as the real script would. Then it acts on what it parsed, the way the
sources say the real tool does: the converters record the KV-cache and quantization algorithms
their flags select, and calibrating without a local dataset fails as an offline node would fail
to download cnn_dailymail.

Controlled by environment variables:

* ``FAKE_TRTLLM_EXPECT``: a JSON file ``{"convert": [...], "build": [...]}`` of the exact
  argument lists each tool must receive. Any difference prints both and exits 3.
* ``FAKE_TRTLLM_MODE``: ``ok`` (default), ``segv``, ``hang``, ``exit1``, ``oom``, ``reserve`` or
  ``incomplete``; applied by the tool named in ``FAKE_TRTLLM_FAIL_AT`` (default ``build``).
  ``oom`` writes memory until killed; ``reserve`` maps 4 GiB of address space without touching
  it (as CUDA does at start-up) and then succeeds.
* ``FAKE_TRTLLM_RECORD``: a directory where each tool appends the argv it received.
* ``FAKE_TRTLLM_DELAY_S``: seconds each tool sleeps before it starts working (default 0).
"""

from __future__ import annotations

import json
import mmap
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from contract import parse, version_from_env  # noqa: E402

HUB_DEFAULTS = ("cnn_dailymail", "ccdv/cnn_dailymail")


def start(tool: str, argv: list[str]) -> str:
    record = os.environ.get("FAKE_TRTLLM_RECORD")
    if record:
        os.makedirs(record, exist_ok=True)
        with open(os.path.join(record, f"{tool}.jsonl"), "a") as f:
            f.write(json.dumps(argv) + "\n")
    expect_file = os.environ.get("FAKE_TRTLLM_EXPECT")
    if expect_file:
        expected = json.load(open(expect_file)).get(tool)
        if expected is not None and expected != argv:
            print(f"[fake {tool}] unexpected arguments", file=sys.stderr)
            print(f"  expected: {expected}", file=sys.stderr)
            print(f"  received: {argv}", file=sys.stderr)
            sys.exit(3)
    time.sleep(float(os.environ.get("FAKE_TRTLLM_DELAY_S", "0")))  # a step that takes a while, as real ones do
    mode = os.environ.get("FAKE_TRTLLM_MODE", "ok")
    if os.environ.get("FAKE_TRTLLM_FAIL_AT", "build") != tool:
        return "ok"
    print(f"[fake {tool}] starting, mode={mode}", flush=True)
    if mode == "segv":
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGSEGV)
    if mode == "hang":
        time.sleep(3600)
    if mode == "oom":
        hog = []
        while True:  # resident memory grows until the orchestrator's watchdog kills the group
            hog.append(b"x" * (64 * 1024 * 1024))
            time.sleep(0.05)
    if mode == "reserve":
        reserved = mmap.mmap(-1, 4 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # untouched: no RSS
        print(f"[fake {tool}] reserved {len(reserved) >> 30} GiB of address space", flush=True)
    if mode == "exit1":
        print("[TRT-LLM] [E] Engine building failed, please check the error log.", file=sys.stderr)
        print("RuntimeError: [TensorRT-LLM][ERROR] out of memory while building rank 3", file=sys.stderr)
        sys.exit(1)
    return mode


def _calibration(dataset: str) -> None:
    """Calibration reads ``dataset``: a local directory, or a hub name that an offline node cannot fetch."""
    if not os.path.isdir(dataset):
        print(f"[fake convert] loading calibration dataset {dataset!r} from the Hugging Face hub", file=sys.stderr)
        print("ConnectionError: Couldn't reach 'https://huggingface.co/datasets/"
              f"{dataset}' (offline build node)", file=sys.stderr)
        sys.exit(1)


def convert(tool: str) -> None:
    """``convert_checkpoint.py`` (tool ``convert_checkpoint``) or ``quantize.py`` (``quantize``)."""
    version = version_from_env()
    argv = sys.argv[1:]
    args = parse(version, tool, argv)  # exits 2 on what the real script's argparse rejects
    start("convert", argv)
    if tool == "quantize":
        kv = {"fp8": "FP8", "int8": "INT8"}.get(args.kv_cache_dtype)
        algo = None if args.qformat == "full_prec" else ("FP8" if args.qformat == "fp8" else args.qformat.upper())
        if algo or kv:
            _calibration(args.calib_dataset)
    else:
        kv = "INT8" if args.int8_kv_cache else None
        if getattr(args, "fp8_kv_cache", False):
            kv = "FP8"
        algo = None
        if args.int8_kv_cache or args.smoothquant is not None:
            _calibration(args.calib_dataset)
    out, tp, pp = args.output_dir, args.tp_size, args.pp_size
    vocab = 1024
    try:
        vocab = int(json.load(open(os.path.join(args.model_dir, "config.json"))).get("vocab_size", vocab))
    except (OSError, ValueError, TypeError):
        pass
    os.makedirs(out, exist_ok=True)
    config = {"architecture": "LlamaForCausalLM", "dtype": args.dtype, "vocab_size": vocab,
              "mapping": {"world_size": tp * pp, "tp_size": tp, "pp_size": pp},
              "quantization": {"quant_algo": algo, "kv_cache_quant_algo": kv}}
    json.dump(config, open(os.path.join(out, "config.json"), "w"))
    for r in range(tp * pp):
        with open(os.path.join(out, f"rank{r}.safetensors"), "wb") as f:
            f.write(b"fake weights %d" % r)
    print(f"[fake {tool} {version}] wrote {tp * pp} ranks to {out}")
