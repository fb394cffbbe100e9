"""The vllm backend's room: the warm-start bundle (:mod:`.bundle`), the child process that serves
it (:mod:`.child`) and the vLLM runtime that child and the validation reference share
(:mod:`.runtime`, the one module that imports vllm). Imports nothing."""
