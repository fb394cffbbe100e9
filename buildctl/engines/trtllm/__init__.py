"""The trtllm backend's room: TensorRT-LLM engines built with ``trtllm-build`` (:mod:`.backend`).
Imports nothing."""
