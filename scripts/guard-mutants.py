#!/usr/bin/env python3
"""Apply each mutant the suite once let through (issue #20) in a clone of the repository (its
last commit) and
require its guard test (marked ``guard``, next to its module's other tests) to fail; the unmutated copy
must pass them all.

    python scripts/guard-mutants.py        # exit 0 when every mutant is killed

Each mutant is one textual edit of the guard code, as written by hand in the issue's table.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# (name, file, old, new, the test that must fail)
MUTANTS = [
    ("TTFT gate uses p50 instead of p99", "buildctl/validators/speed.py",
     'if metric == "ttft_p99":\n            return percentile(self.ttft_s, 99)',
     'if metric == "ttft_p99":\n            return percentile(self.ttft_s, 50)',
     "tests/validators/test_speed.py::test_same_median_ten_times_the_p99_fails_the_ttft_gate"),
    ("local create-only write overwrites (os.link -> os.replace)", "buildctl/artifact_store/backends/local.py",
     "os.link(tmp, final)", "os.replace(tmp, final)",
     "tests/artifact_store/backends/test_store.py::test_create_only_write_loses_to_a_writer_between_check_and_write"),
    ("S3 put without If-None-Match", "buildctl/artifact_store/backends/s3.py",
     'return self._put_object(key, data, IfNoneMatch="*")\n', "return self._put_object(key, data)\n",
     "tests/artifact_store/backends/test_store.py::test_create_only_write_loses_to_a_writer_between_check_and_write"),
    ("backend version dropped from the build key", "buildctl/engines/buildkey.py",
     '"compat_key": compat_key, "backend_version": version}', '"compat_key": compat_key}',
     "tests/engines/test_buildkey.py::test_build_key_changes_with_each_input_and_nothing_else"),
    ("converter flag misspelled", "buildctl/engines/trtllm/backend.py",
     '{"int8": "--int8_kv_cache", "fp8": "--fp8_kv_cache"}', '{"int8": "--int8_kvcache", "fp8": "--fp8_kv_cache"}',
     "tests/engines/trtllm/test_backend.py::test_checkpoint_argv_for_every_quantization_and_kv_dtype"),
    ("pull skips the first file", "buildctl/artifact_store/node/pull.py",
     "manifest.files) if p]", "manifest.files[1:]) if p]",
     "tests/artifact_store/node/test_pull.py::test_pull_refuses_a_corrupted_first_middle_or_last_file"),
    ("a dropped trtllm compat field (driver branch)", "buildctl/engines/trtllm/backend.py",
     '"driver_branch": major(fingerprint.driver_version),', "",
     "tests/engines/test_fingerprint.py::test_compat_keys_change_with_each_compat_field_and_only_those"),
]


def run(copy: Path, test: str, show: bool = False, marker: str | None = None) -> bool:
    only = ["-m", marker] if marker else []
    r = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *only, test], cwd=copy,
                       capture_output=True, text=True)
    if show and r.returncode:
        print(r.stdout[-3000:] + r.stderr[-2000:])
    return r.returncode == 0


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "repo"
        subprocess.run(["git", "clone", "-q", str(REPO), str(copy)], check=True)
        if not run(copy, "tests", show=True, marker="guard"):
            print("the unmutated copy fails the guard tests: fix that first")
            return 1
        survivors = 0
        for name, rel, old, new, test in MUTANTS:
            path = copy / rel
            original = path.read_text()
            if original.count(old) < 1:
                print(f"STALE  {name}: {rel} no longer contains the text to mutate")
                survivors += 1
                continue
            path.write_text(original.replace(old, new, 1))
            killed = not run(copy, test)
            path.write_text(original)
            survivors += not killed
            print(f"{'killed' if killed else 'SURVIVED'}  {name}  ({rel}; {test.split('::')[1]})")
        print(f"{len(MUTANTS) - survivors} of {len(MUTANTS)} mutants killed")
        return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
