"""Fake convert_checkpoint of TensorRT-LLM 0.16 at its release's path (tests/support/fixtures/trtllm/0.16/convert_checkpoint.json)."""
import os
import sys

os.environ["FAKE_TRTLLM_VERSION"] = "0.16"  # the release whose layout this path is
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), *[".."] * 4))
from fakelib import convert  # noqa: E402

convert("convert_checkpoint")
