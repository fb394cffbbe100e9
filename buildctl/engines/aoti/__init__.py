"""The aoti backend's room: the backend (:mod:`.backend`), its AOTInductor compile step
(:mod:`.compile`) and the KV-cached tiny Llama it exports (:mod:`.kv_llama`). Imports nothing."""
