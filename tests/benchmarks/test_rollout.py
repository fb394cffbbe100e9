"""The rollout simulation against cases whose answer is known in closed form."""

from __future__ import annotations

import pytest

from benchmarks.rollout import GB, GBIT, Params, simulate
from buildctl.artifact_store.fleet.waves import wave_bucket


def params(**kw) -> Params:
    base = dict(nodes=1000, size=70 * GB, node_bw=25 * GBIT, egress=100 * GBIT, waves=(100.0,), bake_s=1800.0,
                poll_s=0.0, tick_s=300.0, rack=None)
    base.update(kw)
    return Params(**base)


def test_egress_bound_and_node_bound_transfers():
    # 1000 nodes x 70 GB through 100 Gbit/s: the egress is the bottleneck
    o = simulate(params())
    assert o.done_s == pytest.approx(1000 * 70 * GB / (100 * GBIT), rel=1e-9)
    assert o.peak_egress == pytest.approx(100 * GBIT) and o.store_bytes == pytest.approx(1000 * 70 * GB)
    # 2 nodes: each at its own 25 Gbit/s, the egress is not reached
    o = simulate(params(nodes=2))
    assert o.done_s == pytest.approx(70 * GB / (25 * GBIT), rel=1e-9) and o.peak_egress == pytest.approx(50 * GBIT)


def _last_wave(nodes: int, waves: tuple[float, ...]) -> int:
    buckets = [wave_bucket("llama-3-70b-instruct-fp8-tp8", "prod", f"node-{i:05d}") for i in range(nodes)]
    return max(next(w for w, pct in enumerate(waves) if b < pct or pct >= 100) for b in buckets)


def test_waves_open_at_the_first_flow_run_after_the_bake():
    # few nodes, so no transfer is egress-bound: the last node's wave opens after one bake per wave
    # before it, each rounded up to the next flow run, and its download takes size / node bandwidth
    one = 70 * GB / (25 * GBIT)
    waves = (1.0, 10.0, 50.0, 100.0)
    last = _last_wave(3, waves)
    assert last > 0  # the case bites only if some node waits for a later wave
    assert simulate(params(nodes=3, waves=waves)).done_s == pytest.approx(last * 1800 + one, rel=1e-9)
    last = _last_wave(3, (50.0, 100.0))
    o = simulate(params(nodes=3, waves=(50.0, 100.0), bake_s=100.0))  # bake 100 s: the next wave opens at the 300 s run
    assert o.done_s == pytest.approx(last * 300 + one, rel=1e-9)
    assert simulate(params(nodes=3, waves=waves, tick_s=0.0)).done_s == pytest.approx(_last_wave(3, waves) * 1800 + one)


def test_a_pull_through_cache_reads_the_store_once_per_rack():
    o = simulate(params(nodes=64, rack=32))
    assert o.store_bytes == pytest.approx(2 * 70 * GB)
    # two cache fills at node speed (50 Gbit/s < 100), then every node from its cache at node speed
    assert o.done_s == pytest.approx(2 * 70 * GB / (25 * GBIT), rel=1e-9)


def test_the_model_is_deterministic_and_polling_spreads_starts():
    a, b = simulate(params(nodes=200, poll_s=60.0)), simulate(params(nodes=200, poll_s=60.0))
    assert a == b
    assert simulate(params(nodes=2, poll_s=60.0)).done_s > 70 * GB / (25 * GBIT)
