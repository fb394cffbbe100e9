"""Fake ``tensorrt_llm`` for the preflight test: importing it is what registers plugins upstream."""
