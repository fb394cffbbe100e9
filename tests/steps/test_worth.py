"""``buildctl worth``: the formula on recorded figures (attested ratios, traffic, provenance,
history), each verdict, and "not enough data" naming every input that is missing."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from buildctl.artifact_store.read import get_manifest
from buildctl.artifact_store.trust.attestations import write_attestation
from buildctl.core.times import now_utc
from buildctl.engines.sizing import Traffic
from buildctl.steps.worth import WorthInputs, worth

from ..support.helpers import attestation, write_build_provenance
from .test_runtimes import BUNDLE, ENGINE, NEW, Fleet

DAY = 86400.0


def level(c: int, ratios: list[float], tok_s_per_gpu: float, ttft: list[float] | None = None) -> dict:
    side = {"output_tok_s": tok_s_per_gpu, "output_tok_s_per_gpu": tok_s_per_gpu, "request_throughput": 10.0,
            "ttft_p50_ms": 10.0, "ttft_p99_ms": 12.0, "tpot_p50_ms": 1.0, "tpot_p99_ms": 1.2, "itl_p50_ms": 1.0,
            "itl_p99_ms": 1.5, "output_tok_s_min": 1.0, "output_tok_s_max": 1.0, "output_tok_s_cv": 0.0,
            "repetitions": len(ratios)}
    ttft = ttft or [1.0] * len(ratios)

    def est(metric, xs, bound):
        s = sorted(xs)
        return {"metric": metric, "median": s[len(s) // 2], "low": s[0], "high": s[-1], "confidence": 0.95,
                "samples": xs, "threshold": None, "bound": bound, "verdict": "not gated"}
    return {"concurrency": c, "candidate": side, "reference": side, "throughput_ratio": sorted(ratios)[len(ratios) // 2],
            "p99_ttft_ratio": 1.0, "passed": True, "verdict": "pass",
            "ratios": [est("throughput", ratios, "min"), est("ttft_p99", ttft, "max")]}


class WorthFleet(Fleet):
    def measured(self, profile: str, levels: list[dict], build_s: float | None = 600.0) -> str:
        aid = self.publish(profile, NEW)
        base = attestation(aid, "k", "pass")
        speed = {**base.speed.model_dump(mode="json"), "levels": levels}
        att = attestation(aid, NEW.compat_key("aoti" if profile == ENGINE else "vllm"), "pass",
                          speed=speed, validator_fingerprint=NEW.model_dump(mode="json"),
                          profile={"name": profile, "build_hash": get_manifest(self.store, aid).profile_hash})
        write_attestation(self.store, att)
        if build_s is not None and profile == ENGINE:
            t0 = now_utc()
            write_build_provenance(self.store, aid, started_on=t0.isoformat(),
                                   finished_on=(t0 + timedelta(seconds=build_s)).isoformat())
        return aid


def a_day_of(tokens: int) -> Traffic:
    return Traffic(inputs=[10, 10], outputs=[tokens // 2, tokens // 2], timestamps=[0.0, DAY])


@pytest.fixture
def fleet(tmp_path):
    return WorthFleet(tmp_path)


def run(fleet, **inputs):
    return worth(fleet.ctx, fleet.model, WorthInputs(channel="staging", **inputs))


def test_the_formula_on_full_data_gives_the_ratio_per_level_the_savings_the_payback_and_a_verdict(fleet):
    fleet.measured(ENGINE, [level(1, [3.0] * 6, 500.0), level(16, [2.0, 2.2, 2.4, 2.0, 2.2, 2.4], 900.0)])
    fleet.measured(BUNDLE, [level(1, [1.5] * 6, 250.0), level(16, [1.0, 1.1, 1.2, 1.0, 1.1, 1.2], 1000.0)])
    [w] = run(fleet, traffic=a_day_of(1_000_000), invalidations_per_month=3.0)
    assert w.verdict == "worth it" and w.missing == [] and w.concurrency == 16  # the highest common level
    lv = {x.concurrency: x for x in w.levels}
    assert lv[1].throughput.median == pytest.approx(2.0) and lv[1].throughput.low == pytest.approx(2.0)
    t16 = lv[16].throughput
    assert (t16.median, t16.low, t16.high) == pytest.approx((2.2 / 1.1, 2.0 / 1.2, 2.4 / 1.0))
    g = 1_000_000 / (1000.0 * 3600)  # GPU-hours a day on the bundle at c=16 (its attested tok/s per GPU)
    assert w.gpu_hours_per_day_bundle == pytest.approx(g)
    assert w.saved == pytest.approx((g * (1 - 1.2 / 2.0), g * (1 - 1 / 2.0), g * (1 - 1 / 2.4)))
    assert w.build_gpu_seconds == pytest.approx(600.0) and w.cost_per_day == pytest.approx(0.1 * 600 / 3600)
    assert w.payback_days[1] == pytest.approx((600 / 3600) / (g / 2))
    as_json = w.to_json()
    assert set(as_json["levels"][0]["ratio"]) == {"throughput", "ttft_p99"} and as_json["verdict"] == "worth it"

    # the same engine against frequent, long builds: not worth it; near break-even: uncertain
    assert run(fleet, traffic=a_day_of(1_000_000), invalidations_per_month=300.0)[0].verdict == "not worth it"
    assert run(fleet, traffic=a_day_of(1_000_000), invalidations_per_month=25.0)[0].verdict == "uncertain"
    assert run(fleet, traffic=a_day_of(1_000_000), invalidations_per_month=3.0, concurrency=1)[0].concurrency == 1


def test_the_level_follows_the_traffics_median_concurrency_and_a_worse_ttft_is_noted(fleet):
    fleet.measured(ENGINE, [level(1, [3.0] * 6, 500.0, ttft=[2.0] * 6), level(16, [2.0] * 6, 900.0)])
    fleet.measured(BUNDLE, [level(1, [1.5] * 6, 250.0), level(16, [1.0] * 6, 1000.0)])
    traffic = Traffic(inputs=[1, 1, 1], outputs=[1000, 1000, 1000], concurrency=[2, 3, 30], timestamps=[0.0, 1.0, DAY])
    [w] = run(fleet, traffic=traffic, invalidations_per_month=1.0)
    assert w.concurrency == 1 and any("p99 TTFT is worse" in n for n in w.notes)


def test_missing_inputs_say_not_enough_data_and_name_each_one(fleet):
    fleet.measured(ENGINE, [level(16, [2.0] * 6, 900.0)], build_s=None)
    [w] = run(fleet)
    assert w.verdict == "not enough data" and w.saved is None and w.payback_days is None
    text = " | ".join(w.missing)
    assert "traffic: give --traffic" in text and "spans 0.00 days" in text
    assert "has no build provenance" in text and f"{BUNDLE} has no validated artifact" in text
    no_stamps = Traffic(inputs=[1], outputs=[5])
    [w] = run(fleet, traffic=no_stamps)
    assert any("needs a timestamp" in m for m in w.missing)
    # a month of history with one compat key: 0 invalidations a day counted, not assumed
    [w] = worth(fleet.ctx, fleet.model, WorthInputs(channel="staging"), now=now_utc() + timedelta(days=30))
    assert w.invalidations_per_day == pytest.approx(0.0) and w.invalidations_source.startswith("history: 0 new")


def test_the_cli_prints_the_table_and_json_has_a_ratio_per_level(fleet, cli, tmp_path, monkeypatch):
    fleet.measured(ENGINE, [level(16, [2.0] * 6, 900.0)])
    fleet.measured(BUNDLE, [level(16, [1.0] * 6, 1000.0)])
    traffic = tmp_path / "traffic.jsonl"
    traffic.write_text("\n".join(json.dumps({"input_tokens": 10, "output_tokens": 500_000, "timestamp": t})
                                 for t in ("2026-12-01T00:00:00Z", "2026-12-02T00:00:00Z")) + "\n")
    monkeypatch.setenv("BUILDCTL_STORE", fleet.store.uri)
    args = ("worth", "--model", "tiny-llama", "--channel", "staging", "--traffic", traffic,
            "--invalidations-per-month", "3")
    code, out, err = cli("--json", *args)
    assert code == 0, err
    got = json.loads(out)
    assert got["engine"] == ENGINE and got["bundle"] == BUNDLE
    [key] = got["keys"]
    assert key["levels"][0]["ratio"]["throughput"]["median"] == 2.0 and key["verdict"] == "worth it"
    code, out, err = cli(*args)
    assert code == 0 and "verdict: worth it" in out and "payback" in out
    code, out, err = cli("worth", "--model", "tiny-llama", "--channel", "staging")
    assert code == 0 and "verdict: not enough data: traffic: give --traffic" in out
