"""The trtllm-torch backend's room: a TensorRT-LLM PyTorch-backend bundle (:mod:`.backend`: the
checkpoint, the LLM-API YAML, the autotuner cache and the JIT caches) and the child process that
runs TensorRT-LLM's LLM API on it (:mod:`.child`). Imports nothing."""
