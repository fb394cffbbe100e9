#!/usr/bin/env python3
"""Fake convert_checkpoint.py / quantize.py: writes a TensorRT-LLM checkpoint layout."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fakelib import arg, start  # noqa: E402

argv = sys.argv[1:]
start("convert", argv)
out = arg(argv, "--output_dir")
tp, pp = int(arg(argv, "--tp_size")), int(arg(argv, "--pp_size"))
os.makedirs(out, exist_ok=True)
config = {"architecture": "LlamaForCausalLM", "dtype": arg(argv, "--dtype"),
          "mapping": {"world_size": tp * pp, "tp_size": tp, "pp_size": pp},
          "quantization": {"quant_algo": "FP8" if "fp8" in argv else None}}
json.dump(config, open(os.path.join(out, "config.json"), "w"))
for r in range(tp * pp):
    with open(os.path.join(out, f"rank{r}.safetensors"), "wb") as f:
        f.write(b"fake weights %d" % r)
print(f"[fake convert] wrote {tp * pp} ranks to {out}")
