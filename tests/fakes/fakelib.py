"""Shared logic of the fake TensorRT-LLM tools (tests only; no GPU, no TensorRT).

Controlled by environment variables:

* ``FAKE_TRTLLM_EXPECT``: a JSON file ``{"convert": [...], "build": [...]}`` of the exact
  argument lists each tool must receive. Any difference prints both and exits 3, so a wrong
  flag fails the test that ran the build.
* ``FAKE_TRTLLM_MODE``: ``ok`` (default), ``segv``, ``hang``, ``exit1``, ``oom`` or ``incomplete``;
  applied by the tool named in ``FAKE_TRTLLM_FAIL_AT`` (default ``build``).
* ``FAKE_TRTLLM_RECORD``: a directory where each tool appends the argv it received.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def arg(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


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
        while True:  # past the orchestrator's RLIMIT_AS: MemoryError, like a builder killed for memory
            hog.append(bytearray(256 * 1024 * 1024))
    if mode == "exit1":
        print("[TRT-LLM] [E] Engine building failed, please check the error log.", file=sys.stderr)
        print("RuntimeError: [TensorRT-LLM][ERROR] out of memory while building rank 3", file=sys.stderr)
        sys.exit(1)
    return mode
