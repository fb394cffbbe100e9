"""Profile sizing from observed traffic (``buildctl profile suggest``).

Engines are often built for the worst case (``max_seq_len``, ``max_batch_size``) while traffic
is far smaller, and the KV cache is reserved for that worst case on every GPU. This module reads
observed requests (JSON lines: input and output tokens, optionally a timestamp and the
concurrency seen), summarises them, and recommends engine and vLLM limits that cover the traffic,
with the KV-cache memory per GPU each size reserves.

Every number is computed here from the file; nothing is measured. The rules:

* lengths: the ``coverage`` quantile (1.0: the largest observed) of input and of input+output
  tokens, rounded up to a multiple of ``round_to``, never above the model's
  ``max_position_embeddings``; observed requests the result would reject are counted;
* batch: the peak reported concurrency times ``1 + headroom``, rounded up (kept from the profile
  when the traffic reports no concurrency);
* never below what the profile's own validation workload needs (it runs on the engine);
* ``max_num_tokens``: one prompt of ``max_input_len`` in its prefill step plus one decode token
  for every other sequence of a full batch (the per-step budget when context is not chunked);
* KV bytes per token per GPU: ``2 (K and V) x layers per pipeline stage x ceil(KV heads / TP) x
  head dim x bytes of the KV dtype``; a profile reserves that times ``max_batch_size x
  max_seq_len``; the traffic needs it times the peak concurrency x the covered sequence length.

Quantiles are nearest-rank: the smallest observed value with at least ``q`` of the requests at or
below it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from buildctl.engines.errors import TrafficFileError
from buildctl.engines.profile import BuildProfile
from buildctl.core.times import parse_utc

QUANTILES = (("p50", 0.50), ("p90", 0.90), ("p99", 0.99), ("max", 1.0))
KV_BYTES = {"fp8": 1, "int8": 1, "fp16": 2, "bf16": 2}
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
INPUT_KEYS = ("input_tokens", "prompt_tokens")
OUTPUT_KEYS = ("output_tokens", "completion_tokens")


def quantile(values: list[int], q: float) -> int:
    """Nearest-rank quantile of a non-empty list (``q`` in (0, 1])."""
    s = sorted(values)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def round_up(n: int, to: int) -> int:
    return -(-n // to) * to


@dataclass
class Traffic:
    """The good requests of a traffic file and what was wrong with the others."""

    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    concurrency: list[int] = field(default_factory=list)
    timestamps: list[float] = field(default_factory=list)
    bad: dict[str, list[int]] = field(default_factory=dict)  # reason -> line numbers
    lines: int = 0

    @property
    def totals(self) -> list[int]:
        return [i + o for i, o in zip(self.inputs, self.outputs)]

    @property
    def bad_count(self) -> int:
        return sum(len(v) for v in self.bad.values())


def _int_field(obj: dict[str, Any], keys: tuple[str, ...]) -> int | str:
    for k in keys:
        if k in obj:
            v = obj[k]
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                return f"{k} is not a non-negative integer"
            return v
    return f"no {' or '.join(keys)}"


def _request_time(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return parse_utc(v).timestamp()
        except ValueError:
            return None
    return None


def _parse_line(line: str) -> tuple[int, int, int | None, float | None] | str:
    """(input, output, concurrency, timestamp) of one request line, or why it is malformed."""
    try:
        obj = json.loads(line)
    except ValueError:
        return "not JSON"
    if not isinstance(obj, dict):
        return "not a JSON object"
    i, o = _int_field(obj, INPUT_KEYS), _int_field(obj, OUTPUT_KEYS)
    if isinstance(i, str):
        return i
    if isinstance(o, str):
        return o
    ts, c = obj.get("timestamp"), obj.get("concurrency")
    stamp = _request_time(ts) if ts is not None else None
    if ts is not None and stamp is None:
        return "timestamp is neither a number nor an ISO-8601 time"
    if c is not None and (isinstance(c, bool) or not isinstance(c, int) or c < 1):
        return "concurrency is not a positive integer"
    return i, o, c, stamp


def read_traffic(path: str | Path, max_bad_fraction: float = 0.01) -> Traffic:
    """Parse a traffic file. Malformed lines are counted by reason; more than
    ``max_bad_fraction`` of them (or no good line) is :class:`TrafficFileError`."""
    t = Traffic()
    try:
        f = open(path, encoding="utf-8", errors="replace")
    except OSError as err:
        raise TrafficFileError(str(path), f"cannot read it: {err.strerror}", {}) from None
    with f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            t.lines += 1
            got = _parse_line(line)
            if isinstance(got, str):
                t.bad.setdefault(got, []).append(n)
                continue
            i, o, c, ts = got
            t.inputs.append(i)
            t.outputs.append(o)
            if c is not None:
                t.concurrency.append(c)
            if ts is not None:
                t.timestamps.append(ts)
    if not t.inputs:
        raise TrafficFileError(str(path), f"no usable request in {t.lines} line(s)", t.bad)
    if t.bad_count > max_bad_fraction * t.lines:
        raise TrafficFileError(str(path), f"{t.bad_count} of {t.lines} lines are malformed, over the allowed "
                               f"{max_bad_fraction:.2%}", t.bad)
    return t


@dataclass(frozen=True)
class KvShape:
    """What the KV cache per token depends on."""

    layers: int
    kv_heads: int
    head_dim: int
    max_position_embeddings: int | None

    @classmethod
    def from_config(cls, config: dict[str, Any], source: str) -> "KvShape":
        try:
            heads = int(config["num_attention_heads"])
            return cls(layers=int(config["num_hidden_layers"]),
                       kv_heads=int(config.get("num_key_value_heads") or heads),
                       head_dim=int(config.get("head_dim") or int(config["hidden_size"]) // heads),
                       max_position_embeddings=config.get("max_position_embeddings"))
        except (KeyError, TypeError, ValueError) as err:
            raise TrafficFileError(source, f"model config lacks what the KV estimate needs ({err})", {}) from None


def kv_bytes_per_token(shape: KvShape, profile: BuildProfile) -> int:
    """KV-cache bytes one token takes on one GPU under the profile's parallelism and KV dtype."""
    e = profile.engine
    width = KV_BYTES.get(e.kv_cache_dtype) or DTYPE_BYTES[profile.model.dtype]
    return 2 * math.ceil(shape.layers / e.pp_size) * math.ceil(shape.kv_heads / e.tp_size) * shape.head_dim * width


@dataclass
class Suggestion:
    """The traffic summary, the recommended limits, and the KV estimate."""

    requests: int
    bad: dict[str, list[int]]
    lines: int
    lengths: dict[str, dict[str, int]]  # input/output/total -> p50/p90/p99/max
    peak_concurrency: int | None
    peak_arrivals_per_s: int | None
    current: dict[str, int | None]
    recommended: dict[str, int]
    rejected: int  # observed requests the recommended lengths would refuse
    capped_by_model: bool
    kv_bytes_per_token: int
    kv_reserved_bytes: int  # per GPU, by the current profile
    kv_needed_bytes: int  # per GPU, for the traffic at its peak
    kv_recommended_bytes: int  # per GPU, by the recommended profile
    notes: list[str]

    @property
    def over_provisioning(self) -> float:
        return self.kv_reserved_bytes / self.kv_needed_bytes if self.kv_needed_bytes else math.inf

    def to_json(self) -> dict[str, Any]:
        return {"requests": self.requests, "lines": self.lines,
                "malformed": {k: {"count": len(v), "lines": v[:20]} for k, v in self.bad.items()},
                "lengths": self.lengths, "peak_concurrency": self.peak_concurrency,
                "peak_arrivals_per_s": self.peak_arrivals_per_s, "current": self.current,
                "recommended": self.recommended, "rejected_by_recommendation": self.rejected,
                "capped_by_model": self.capped_by_model,
                "kv_cache": {"bytes_per_token_per_gpu": self.kv_bytes_per_token,
                             "reserved_per_gpu": self.kv_reserved_bytes, "needed_per_gpu": self.kv_needed_bytes,
                             "recommended_per_gpu": self.kv_recommended_bytes,
                             "over_provisioning": round(self.over_provisioning, 3)},
                "notes": self.notes}


def suggest(profile: BuildProfile, traffic: Traffic, shape: KvShape, *, coverage: float = 1.0,
            headroom: float = 0.25, round_to: int = 256) -> Suggestion:
    """Recommend limits for ``profile`` from ``traffic`` (see the module docstring for the rules)."""
    if not 0 < coverage <= 1:
        raise TrafficFileError("--coverage", f"{coverage} is not in (0, 1]", {})
    if round_to < 1 or headroom < 0:
        raise TrafficFileError("--round/--headroom", "round must be >= 1 and headroom >= 0", {})
    e = profile.engine
    totals = traffic.totals
    lengths = {name: {label: quantile(vals, q) for label, q in QUANTILES}
               for name, vals in (("input", traffic.inputs), ("output", traffic.outputs), ("total", totals))}
    notes: list[str] = []
    max_input = round_up(max(1, quantile(traffic.inputs, coverage)), round_to)
    max_seq = round_up(max(2, quantile(totals, coverage)), round_to)
    capped = False
    if shape.max_position_embeddings and max_seq > shape.max_position_embeddings:
        capped = True
        max_seq = int(shape.max_position_embeddings)
        notes.append(f"the traffic's lengths exceed the model's max_position_embeddings ({max_seq}): capped there")
    max_input = min(max_input, max_seq)
    # The profile's own validation runs on the engine: its workload must still fit.
    v = profile.validation
    need_seq = max(v.speed.input_len + v.speed.output_len, v.max_tokens + 1)
    if max_seq < need_seq or max_input < v.speed.input_len:
        max_seq, max_input = max(max_seq, round_up(need_seq, round_to)), max(max_input, v.speed.input_len)
        notes.append(f"raised to fit the profile's validation workload (speed input {v.speed.input_len} + output "
                     f"{v.speed.output_len} tokens, max_tokens {v.max_tokens})")
    peak = max(traffic.concurrency) if traffic.concurrency else None
    if peak is None:
        batch = e.max_batch_size
        notes.append("the traffic reports no concurrency: max_batch_size kept from the profile")
    else:
        batch = max(1, math.ceil(peak * (1 + headroom)))
    if batch < max(v.speed.concurrency):
        batch = max(v.speed.concurrency)
        notes.append(f"max_batch_size raised to the validation's highest speed concurrency ({batch})")
    num_tokens = min(max_input + batch - 1, batch * max_seq)
    recommended = {"max_input_len": max_input, "max_seq_len": max_seq, "max_num_tokens": max(num_tokens, batch),
                   "max_batch_size": batch, "vllm_max_model_len": max_seq, "vllm_max_num_seqs": batch}
    rejected = sum(1 for i, t in zip(traffic.inputs, totals) if i > max_input or t > max_seq)
    if rejected:
        notes.append(f"{rejected} observed request(s) exceed the recommended lengths (coverage {coverage:g})")
    arrivals = None
    if traffic.timestamps:
        per_s: dict[int, int] = {}
        for ts in traffic.timestamps:
            per_s[int(math.floor(ts))] = per_s.get(int(math.floor(ts)), 0) + 1
        arrivals = max(per_s.values())
    per_token = kv_bytes_per_token(shape, profile)
    covered_total = quantile(totals, coverage)
    need_batch = peak if peak is not None else e.max_batch_size
    return Suggestion(
        requests=len(traffic.inputs), bad=traffic.bad, lines=traffic.lines, lengths=lengths,
        peak_concurrency=peak, peak_arrivals_per_s=arrivals,
        current={"max_input_len": e.max_input_len, "max_seq_len": e.max_seq_len, "max_num_tokens": e.max_num_tokens,
                 "max_batch_size": e.max_batch_size, "vllm_max_model_len": profile.reference.max_model_len,
                 "vllm_max_num_seqs": profile.reference.max_num_seqs},
        recommended=recommended, rejected=rejected, capped_by_model=capped, kv_bytes_per_token=per_token,
        kv_reserved_bytes=per_token * e.max_batch_size * e.max_seq_len,
        kv_needed_bytes=per_token * need_batch * min(covered_total, max_seq),
        kv_recommended_bytes=per_token * batch * max_seq, notes=notes)


def patched_profile(original: dict[str, Any], s: Suggestion) -> dict[str, Any]:
    """The profile's YAML data with the recommended limits written in."""
    out = json.loads(json.dumps(original))  # a deep copy of plain data
    engine = out.setdefault("engine", {})
    for k in ("max_input_len", "max_seq_len", "max_num_tokens", "max_batch_size"):
        engine[k] = s.recommended[k]
    ref = out.setdefault("reference", {})
    ref["max_model_len"] = s.recommended["vllm_max_model_len"]
    ref["max_num_seqs"] = s.recommended["vllm_max_num_seqs"]
    return out


def model_shape(profile: BuildProfile, config_file: str | Path | None = None) -> KvShape:
    """The KV shape of the profile's model: from ``config_file`` (an HF ``config.json``) when
    given, else the tiny model's architecture or the local checkpoint's ``config.json``."""
    if config_file is None and profile.model.tiny is not None:
        from buildctl.engines.tiny import ARCH

        return KvShape.from_config(dict(ARCH), "the tiny model")
    if config_file is None and profile.model.path:
        config_file = Path(profile.model.path) / "config.json"
    if config_file is None:
        raise TrafficFileError(profile.name, "the model is remote: pass --model-config with its config.json", {})
    try:
        config = json.loads(Path(config_file).read_text())
    except (OSError, ValueError) as err:
        raise TrafficFileError(str(config_file), f"cannot read the model config: {err}", {}) from None
    if not isinstance(config, dict):
        raise TrafficFileError(str(config_file), "the model config is not a JSON object", {})
    return KvShape.from_config(config, str(config_file))
