"""Validation: the vLLM reference runner, output parity, speed, and attestations."""
