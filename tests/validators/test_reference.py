"""The vLLM reference runner's start: on a CPU host vLLM's model inspection runs in this process."""

from __future__ import annotations

import os

import pytest

from buildctl.validators.reference import _inspect_in_process


def test_on_cpu_the_model_inspection_runs_here_and_the_original_comes_back():
    from vllm.model_executor.models import registry

    original = registry._run_in_subprocess
    with _inspect_in_process(cpu=True):
        assert registry._run_in_subprocess is not original
        assert registry._run_in_subprocess(os.getpid) == os.getpid()  # no child process ran it
    assert registry._run_in_subprocess is original


def test_with_a_gpu_vllm_keeps_its_subprocess():
    from vllm.model_executor.models import registry

    original = registry._run_in_subprocess
    with _inspect_in_process(cpu=False):
        assert registry._run_in_subprocess is original
    assert registry._run_in_subprocess is original


@pytest.mark.slow  # a vLLM start in a child process: about 40 s on 2 busy cores
def test_the_references_vllm_log_lines_go_to_the_log_file_not_to_stderr(tiny_build, tmp_path):
    """#50 item 6: vLLM's own output (43 lines per start) stays out of the progress lines on stderr;
    it is appended to BUILDCTL_VLLM_LOG (default <cache dir>/logs/vllm.log)."""
    import os
    import subprocess
    import sys

    log = tmp_path / "vllm.log"
    from ..support.helpers import PROFILES

    code = ("import sys; from buildctl.engines.profile import load_profile; "
            "from buildctl.validators.reference import VllmRunner; "
            "r = VllmRunner(sys.argv[1], load_profile(sys.argv[2]).reference); r.close()")
    r = subprocess.run([sys.executable, "-c", code, str(tiny_build["model"]), str(PROFILES / "tiny-llama-cpu.yaml")],
                       env={**os.environ, "BUILDCTL_VLLM_LOG": str(log)}, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    vllm_lines = [ln for ln in r.stderr.splitlines() if "vllm" in ln.lower() and ("INFO" in ln or "WARNING" in ln)]
    assert not vllm_lines, vllm_lines[:5]
    assert " vllm" in log.read_text() and len(log.read_text().splitlines()) >= 5
