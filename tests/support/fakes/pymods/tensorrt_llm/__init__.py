"""Fake ``tensorrt_llm`` (tests only): importing it is what registers plugins upstream (preflight),
and its runtime behaves as ``tests/support/fixtures/trtllm/1.2.1/runtime.json`` says the real one does."""

import os


def mpi_rank() -> int:
    return int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))


def mpi_world_size() -> int:
    return int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))


# --- The LLM API (the PyTorch backend), for the trtllm-torch bundle: see llmapi.py. ---

__version__ = os.environ.get("FAKE_TRTLLM_VERSION", "1.2.1")

if __version__ not in ("1.2.1", "0.16"):  # 1.4.0rc1: tensorrt_llm/_bootstrap.py's unified cache root, at import
    from tensorrt_llm.llmapi import setup_unified_cache as _setup_unified_cache

    _setup_unified_cache()


def __getattr__(name: str):
    if name in ("LLM", "SamplingParams"):
        from tensorrt_llm import llmapi

        return getattr(llmapi, name)
    raise AttributeError(name)
