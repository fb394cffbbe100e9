"""``buildctl worth``: is a served model's compiled engine worth its operational cost over its
vLLM bundle?

Every input is already on record; nothing is measured here and nothing is assumed:

* the speed ratio of engine over bundle, per concurrency level, from their attestations: each was
  measured against the same vLLM reference, so engine/bundle = (engine/reference) /
  (bundle/reference), with the interval ``[e.low / b.high, e.high / b.low]`` (conservative: both
  intervals at their unfavourable ends);
* the traffic: output tokens per day from a traffic file (``profile suggest``'s input: JSON lines
  with ``output_tokens`` and a ``timestamp``);
* the bundle's output tok/s per GPU at the chosen level, from its attestation;
* one build's GPU-seconds: the engine's provenance (``finishedOn - startedOn``) x the profile's
  world size;
* invalidations per day: new compat keys in the engine channel's history (each one a rebuild)
  over the history's span, or ``--invalidations-per-month`` given by the operator.

Then, with ``r`` the throughput ratio and ``G`` the GPU-hours a day the bundle needs for the
traffic (``tokens_per_day / (tok_s_per_gpu x 3600)``):

    saved(r)   = G x (1 - 1/r)                       GPU-hours a day the engine saves
    cost       = invalidations_per_day x build_gpu_hours
    net(r)     = saved(r) - cost
    payback(r) = build_gpu_hours / saved(r)          days of savings that pay one build

The verdict is ``worth it`` when ``net`` at the interval's low end is above zero, ``not worth it``
when at its high end it is at most zero, ``uncertain`` otherwise; with any input missing it is
``not enough data`` and says which (docs/validation.md has a worked example).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from buildctl.artifact_store.channels import channel_compat_keys, history, read_channel
from buildctl.artifact_store.trust.attestations import Attestation, RatioEstimate
from buildctl.artifact_store.trust.provenance import read_provenance
from buildctl.core.errors import BadInputError
from buildctl.core.times import now_utc, parse_utc
from buildctl.engines.fingerprint import parse_fingerprint
from buildctl.engines.served import ServedModel
from buildctl.engines.sizing import Traffic, quantile
from buildctl.steps.context import Context
from buildctl.steps.profiles import profile_by_name
from buildctl.steps.validate import passing_attestation

Verdict = Literal["worth it", "not worth it", "uncertain", "not enough data"]
DAY_S = 86400.0
MONTH_DAYS = 30.0


@dataclass(frozen=True)
class Ratio:
    """Engine over bundle for one metric at one level: the medians' ratio and a conservative interval."""

    median: float
    low: float | None
    high: float | None

    @classmethod
    def of(cls, engine: RatioEstimate, bundle: RatioEstimate) -> "Ratio":
        low = engine.low / bundle.high if engine.low is not None and bundle.high else None
        high = engine.high / bundle.low if engine.high is not None and bundle.low else None
        return cls(engine.median / bundle.median, low, high)

    def to_json(self) -> dict[str, float | None]:
        return {"median": round(self.median, 4), "low": _r(self.low), "high": _r(self.high)}


def _r(x: float | None, n: int = 4) -> float | None:
    return None if x is None else round(x, n)


@dataclass
class Level:
    concurrency: int
    throughput: Ratio
    ttft_p99: Ratio | None
    bundle_tok_s_per_gpu: float

    def to_json(self) -> dict[str, Any]:
        return {"concurrency": self.concurrency, "bundle_tok_s_per_gpu": round(self.bundle_tok_s_per_gpu, 2),
                "ratio": {"throughput": self.throughput.to_json(),
                          "ttft_p99": self.ttft_p99.to_json() if self.ttft_p99 else None}}


@dataclass
class KeyWorth:
    """The answer for one compat key of the engine."""

    compat_key: str
    engine_artifact: str | None = None
    bundle_compat_key: str | None = None
    bundle_artifact: str | None = None
    levels: list[Level] = field(default_factory=list)
    concurrency: int | None = None  # the level the verdict uses
    tokens_per_day: float | None = None
    build_gpu_seconds: float | None = None
    invalidations_per_day: float | None = None
    invalidations_source: str | None = None
    gpu_hours_per_day_bundle: float | None = None
    saved: tuple[float, float, float] | None = None  # GPU-hours a day: low, median, high
    cost_per_day: float | None = None
    payback_days: tuple[float | None, float | None, float | None] | None = None  # at low, median, high
    verdict: Verdict = "not enough data"
    missing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        rnd = (lambda t: None if t is None else [_r(x, 3) for x in t])
        return {"compat_key": self.compat_key, "engine_artifact": self.engine_artifact,
                "bundle_compat_key": self.bundle_compat_key, "bundle_artifact": self.bundle_artifact,
                "levels": [lv.to_json() for lv in self.levels], "concurrency": self.concurrency,
                "tokens_per_day": _r(self.tokens_per_day, 1), "build_gpu_seconds": _r(self.build_gpu_seconds, 1),
                "invalidations_per_day": _r(self.invalidations_per_day, 5),
                "invalidations_source": self.invalidations_source,
                "gpu_hours_per_day_bundle": _r(self.gpu_hours_per_day_bundle, 3),
                "gpu_hours_saved_per_day": rnd(self.saved), "build_cost_gpu_hours_per_day": _r(self.cost_per_day, 4),
                "payback_days": rnd(self.payback_days), "verdict": self.verdict, "missing": self.missing,
                "notes": self.notes}


@dataclass(frozen=True)
class WorthInputs:
    """What the operator gives besides the store: the traffic and, optionally, a level and an invalidation rate."""

    channel: str = "prod"
    traffic: Traffic | None = None
    concurrency: int | None = None
    invalidations_per_month: float | None = None
    min_history_days: float = 7.0


def traffic_rate(traffic: Traffic) -> tuple[float | None, str | None]:
    """Output tokens per day, from the traffic's span; ``(None, why)`` when its timestamps do not give one."""
    if len(traffic.timestamps) < 2 or len(traffic.timestamps) != len(traffic.outputs):
        return None, "traffic: every request needs a timestamp (the rate is tokens over the file's time span)"
    span = max(traffic.timestamps) - min(traffic.timestamps)
    if span <= 0:
        return None, "traffic: its timestamps span no time"
    return sum(traffic.outputs) * DAY_S / span, None


def _level_for(common: list[int], inputs: WorthInputs) -> int:
    """The level the verdict uses: the one asked for, else the measured level nearest the traffic's
    median concurrency, else the highest (a fleet batches)."""
    if inputs.concurrency is not None:
        return inputs.concurrency
    t = inputs.traffic
    if t is not None and t.concurrency:
        median = quantile(t.concurrency, 0.5)
        return min(common, key=lambda c: (abs(c - median), c))
    return max(common)


def _ratios(att: Attestation) -> dict[int, dict[str, RatioEstimate]]:
    return {lv.concurrency: {r.metric: r for r in lv.ratios} for lv in att.speed.levels}


def _invalidations(ctx: Context, profile: str, channel: str, inputs: WorthInputs,
                   now: datetime) -> tuple[float | None, str | None, str | None]:
    """(per day, where from, what is missing)."""
    if inputs.invalidations_per_month is not None:
        return inputs.invalidations_per_month / MONTH_DAYS, "given (--invalidations-per-month)", None
    records = history(ctx.store, profile, channel)
    if not records:
        return None, None, f"history: {profile} has no record on {channel}"
    first = min(parse_utc(r.when) for r in records)
    days = (now - first).total_seconds() / DAY_S
    if days < inputs.min_history_days:
        return None, None, (f"history: {profile} on {channel} spans {days:.2f} days, fewer than {inputs.min_history_days:g}"
                            " (give --invalidations-per-month, or wait)")
    keys = list(dict.fromkeys(r.compat_key for r in sorted(records, key=lambda r: (r.when, r.seq))))
    return (len(keys) - 1) / days, f"history: {len(keys) - 1} new compat key(s) in {days:.1f} days", None


def _build_gpu_seconds(ctx: Context, artifact_id: str, world_size: int) -> tuple[float | None, str | None]:
    prov = read_provenance(ctx.store, artifact_id)
    secs = prov.build_seconds() if prov is not None else None
    if secs is None:
        return None, f"provenance: {artifact_id} has no build provenance with startedOn and finishedOn"
    return secs * max(1, world_size), None


def worth(ctx: Context, model: ServedModel, inputs: WorthInputs = WorthInputs(), *,
          now: datetime | None = None) -> list[KeyWorth]:
    """The answer for every compat key the engine (the model's preferred runtime) has on the
    channel; see the module docstring. ``BadInputError`` when the model has no second runtime."""
    if len(model.runtimes) < 2:
        raise BadInputError(f"served model {model.name} has one runtime ({model.preferred}): nothing to compare it with")
    now = now or now_utc()
    engine, bundle = profile_by_name(ctx.settings, model.runtimes[0]), profile_by_name(ctx.settings, model.runtimes[1])
    rate, rate_missing = traffic_rate(inputs.traffic) if inputs.traffic is not None else (
        None, "traffic: give --traffic FILE (JSON lines with output_tokens and timestamp)")
    inval, inval_source, inval_missing = _invalidations(ctx, engine.name, inputs.channel, inputs, now)
    out = []
    for key in channel_compat_keys(ctx.store, engine.name, inputs.channel):
        w = KeyWorth(key, tokens_per_day=rate, invalidations_per_day=inval, invalidations_source=inval_source)
        w.missing += [m for m in (rate_missing, inval_missing) if m]
        out.append(w)
        got = read_channel(ctx.store, engine.name, inputs.channel, key)
        if got is None:
            continue
        w.engine_artifact = got[0].artifact_id
        e_att = passing_attestation(ctx.store, w.engine_artifact, key)
        if e_att is None:
            w.missing.append(f"attestation: {w.engine_artifact} has no passing validation for {key}")
            continue
        w.build_gpu_seconds, why = _build_gpu_seconds(ctx, w.engine_artifact, engine.engine.world_size)
        if why:
            w.missing.append(why)
        host = parse_fingerprint(e_att.attestation.validator_fingerprint, f"validator of {w.engine_artifact}")
        w.bundle_compat_key = host.compat_key(bundle.engine.backend)
        b_rec = read_channel(ctx.store, bundle.name, inputs.channel, w.bundle_compat_key)
        b_att = passing_attestation(ctx.store, b_rec[0].artifact_id, w.bundle_compat_key) if b_rec else None
        if b_att is None:
            w.missing.append(f"bundle: {bundle.name} has no validated artifact on {inputs.channel} for "
                             f"{w.bundle_compat_key} (the engine's validating host)")
            continue
        w.bundle_artifact = b_rec[0].artifact_id if b_rec else None
        e_lv, b_lv = _ratios(e_att.attestation), _ratios(b_att.attestation)
        sides = {lv.concurrency: lv.candidate for lv in b_att.attestation.speed.levels}
        for c in sorted(set(e_lv) & set(b_lv)):
            if "throughput" not in e_lv[c] or "throughput" not in b_lv[c]:
                continue
            ttft = (Ratio.of(e_lv[c]["ttft_p99"], b_lv[c]["ttft_p99"])
                    if "ttft_p99" in e_lv[c] and "ttft_p99" in b_lv[c] else None)
            w.levels.append(Level(c, Ratio.of(e_lv[c]["throughput"], b_lv[c]["throughput"]), ttft,
                                  sides[c].output_tok_s_per_gpu))
        if not w.levels:
            w.missing.append("speed: the two attestations share no measured concurrency level")
            continue
        w.concurrency = _level_for([lv.concurrency for lv in w.levels], inputs)
        level = next((lv for lv in w.levels if lv.concurrency == w.concurrency), None)
        if level is None:
            w.missing.append(f"speed: no level {w.concurrency} in both attestations "
                             f"(measured in both: {[lv.concurrency for lv in w.levels]})")
            continue
        if level.throughput.low is None or level.throughput.high is None:
            w.missing.append(f"speed: the throughput ratios at c={level.concurrency} have no interval")
        _decide(w, level)
    return out


def _decide(w: KeyWorth, level: Level) -> None:
    """Fill in the figures and the verdict when nothing is missing."""
    if w.missing:
        return
    assert w.tokens_per_day is not None and w.build_gpu_seconds is not None and w.invalidations_per_day is not None
    assert level.throughput.low is not None and level.throughput.high is not None
    g = w.tokens_per_day / (level.bundle_tok_s_per_gpu * 3600.0)
    build_h = w.build_gpu_seconds / 3600.0
    saved = tuple(g * (1 - 1 / r) for r in (level.throughput.low, level.throughput.median, level.throughput.high))
    w.gpu_hours_per_day_bundle = g
    w.saved = saved  # type: ignore[assignment]
    w.cost_per_day = w.invalidations_per_day * build_h
    w.payback_days = tuple(build_h / s if s > 0 else None for s in saved)  # type: ignore[assignment]
    net_low, net_high = saved[0] - w.cost_per_day, saved[2] - w.cost_per_day
    w.verdict = "worth it" if net_low > 0 else ("not worth it" if net_high <= 0 else "uncertain")
    t = level.ttft_p99
    if t is not None and t.low is not None and t.low > 1:
        w.notes.append(f"the engine's p99 TTFT is worse than the bundle's at c={level.concurrency} "
                       f"({t.median:.2f}x, interval from {t.low:.2f})")

