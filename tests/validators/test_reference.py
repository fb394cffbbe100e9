"""The vLLM reference runner's start: on a CPU host vLLM's model inspection runs in this process."""

from __future__ import annotations

import os

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
