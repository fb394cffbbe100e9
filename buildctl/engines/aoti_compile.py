"""The aoti build step, run in its own subprocess by :mod:`engines.aoti`.

``python -m buildctl.engines.aoti_compile --model DIR --out DIR --record FILE`` exports a logits-only
forward (input_ids -> logits) of the HF checkpoint with dynamic batch and sequence dimensions,
compiles it with AOTInductor into ``model.pt2``, and embeds the build record (read from
``--record``) in the package metadata. It prints progress lines to stdout (the build log).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--record", required=True)
    args = ap.parse_args(argv)
    record = json.loads(Path(args.record).read_text())
    t0 = time.monotonic()

    import torch
    from torch.export import Dim
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, record["dtype"])
    print(f"[aoti] torch {torch.__version__}, loading {args.model} as {record['dtype']}", flush=True)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype)
    model.eval()

    class LogitsOnly(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            return self.inner(input_ids=input_ids, use_cache=False).logits

    wrapper = LogitsOnly(model).eval()
    example = torch.randint(4, 100, (2, 8), dtype=torch.long)
    dynamic = {"input_ids": {0: Dim("batch", min=1, max=record["max_batch_size"]),
                             1: Dim("seq", min=2, max=record["max_seq_len"])}}
    with torch.no_grad():
        ep = torch.export.export(wrapper, (example,), dynamic_shapes=dynamic, strict=False)
    print(f"[aoti] exported in {time.monotonic() - t0:.1f}s; compiling", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    metadata = {"buildctl_record": json.dumps(record, sort_keys=True)}
    torch._inductor.aoti_compile_and_package(
        ep, package_path=str(out / "model.pt2"),
        inductor_configs={"aot_inductor.precompile_headers": False, "aot_inductor.metadata": metadata},
    )
    (out / "engine.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    print(f"[aoti] wrote {out / 'model.pt2'} ({(out / 'model.pt2').stat().st_size} bytes) in "
          f"{time.monotonic() - t0:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
