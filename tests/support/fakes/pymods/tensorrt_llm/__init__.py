"""Fake ``tensorrt_llm`` (tests only): importing it is what registers plugins upstream (preflight),
and its runtime behaves as ``tests/support/fixtures/trtllm/1.2.1/runtime.json`` says the real one does."""

import os


def mpi_rank() -> int:
    return int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))


def mpi_world_size() -> int:
    return int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
