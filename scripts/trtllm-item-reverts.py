#!/usr/bin/env python3
"""Check that each audit-item test of tests/engines/trtllm/test_contract.py bites: revert one fix at a time
in a copy of the tree and expect that item's test to fail (and the unreverted copy to pass).

    .venv/bin/python scripts/trtllm-item-reverts.py

Each revert is the smallest edit that brings back the behaviour issue 16 found. Exit 0 when every
reverted copy fails its test and the clean copy passes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

REVERTS = [  # (item, file, the fix, what was there before)
    ("item_1", "buildctl/engines/trtllm/backend.py", "output_generation_logits=bool(top_logprobs)))", "output_generation_logits=False))"),
    ("item_2", "buildctl/engines/trtllm/backend.py", "                for tok in response.result.output_token_ids[0]:",
     "                for tok in [-1] * max_tokens:"),
    ("item_3", "buildctl/engines/trtllm/backend.py",
     "            kwargs.update(is_orchestrator_mode=True, device_ids=list(range(self.world_size)))", "            pass"),
    ("item_4", "buildctl/engines/trtllm/backend.py", "                    if pending:\n                        yield submit()",
     "                    if pending and not in_flight:\n"
     "                        while pending and len(in_flight) < max(1, concurrency):\n"
     "                            yield submit()"),
    ("item_5", "buildctl/engines/trtllm/backend.py", "            cmd.append(flag)", "            pass"),
    ("item_6", "buildctl/engines/trtllm/backend.py", '        cmd += ["--calib_dataset", calib.dataset, "--calib_size", str(calib.size)]',
     '        cmd += ["--calib_size", str(calib.size)]'),
    ("item_7", "buildctl/engines/trtllm/backend.py", "        release = release_for(version or settings.trtllm_version) or RELEASES[0]",
     "        release = RELEASES[0]"),
    ("item_8", "build_profiles/llama-3-8b-instruct-fp8-tp1.yaml", "    gemm_plugin: disable", "    gemm_plugin: auto"),
    ("item_9", "buildctl/engines/trtllm/backend.py", '            "platform": fingerprint.platform,', ""),
    ("item_10", "tests/trtllm_kit.py", 'driver_version=s["driver"], cuda_version=s["cuda"]',
     'driver_version="550.54.15", cuda_version="12.4"'),
    ("item_11", "buildctl/engines/isolate.py",
     "                                    env=dict(env) if env is not None else None, cwd=cwd, start_new_session=True)",
     "                                    env=dict(env) if env is not None else None, cwd=cwd, start_new_session=True,\n"
     "                                    preexec_fn=(lambda: __import__('resource').setrlimit(__import__('resource')"
     ".RLIMIT_AS, (memory_limit_mb << 20,) * 2)) if memory_limit_mb else None)"),
]


def run(copy: Path, item: str) -> bool:
    """Whether ``item``'s test passes in ``copy``."""
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                        "tests/engines/trtllm/test_contract.py", "-k", item], cwd=copy, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(copy)})
    return r.returncode == 0


def main() -> int:
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    with tempfile.TemporaryDirectory(prefix="buildctl-reverts-") as tmp:
        copy = Path(tmp)
        for rel in files:
            src, dst = REPO / rel, copy / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_symlink():
                os.symlink(os.readlink(src), dst)
            elif src.is_file():
                shutil.copy2(src, dst)
        ok = run(copy, "item")
        print(f"clean copy: {'passes' if ok else 'FAILS'}")
        bad = not ok
        for item, rel, fix, before in REVERTS:
            path = copy / rel
            text = path.read_text()
            if fix not in text:
                print(f"{item}: the fix is not where expected in {rel}")
                bad = True
                continue
            path.write_text(text.replace(fix, before, 1))
            passes = run(copy, item + "_")
            path.write_text(text)
            print(f"{item}: {'PASSES with the fix reverted (the test does not bite)' if passes else 'fails with the fix reverted'}")
            bad = bad or passes
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
