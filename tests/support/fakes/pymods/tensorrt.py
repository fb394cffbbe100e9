"""Fake ``tensorrt`` for the trtllm preflight test: a plan containing b"WRONG-DEVICE" fails to
deserialize (``None``), as TensorRT does for a plan built on another SM or TensorRT version."""


class Logger:
    WARNING = 2

    def __init__(self, level=None):
        self.level = level


class Runtime:
    def __init__(self, logger):
        self.logger = logger

    def deserialize_cuda_engine(self, plan: bytes):
        if b"WRONG-DEVICE" in plan:
            print("[TRT] [E] The engine plan file is generated on an incompatible device, expecting compute 9.0 got compute 8.9")
            return None
        return object()
