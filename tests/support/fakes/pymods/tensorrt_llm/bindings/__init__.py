"""Fake ``tensorrt_llm.bindings``: only the executor submodule."""
