"""The upgrade simulation: its decisions are buildctl's own, and cases with a closed-form answer."""

from __future__ import annotations

import pytest

from benchmarks.upgrade import FALLBACK, GPUS, PROFILES, SWAP_MIN, UPGRADES, host, node_wait, simulate, work_for


@pytest.mark.parametrize("upgrade,legacy,new", [
    ("driver branch 550 -> 580", "build", "re-check"),  # soft for trtllm now; the schema-1 key held the branch
    ("TensorRT-LLM 1.2.1 -> 1.2.2", "build", "build"),  # hard either way
])
def test_the_work_per_pair_is_what_the_compat_keys_say(upgrade, legacy, new):
    for gpu in GPUS:
        before = host(gpu)
        after = before.model_copy(update=UPGRADES[upgrade])
        assert work_for(before, after, legacy=True) == legacy and work_for(before, after, legacy=False) == new
    assert work_for(host(GPUS[0]), host(GPUS[0]).model_copy(update={"torch_version": "2.9.0"}), legacy=False) == "none"


def test_one_batch_closed_form():
    """One batch of 3 nodes per model, no jitter in expectation: node p waits for the builds of
    profiles 0..p plus their validations; planned nodes wait only for the swap."""
    # with ±20% jitter, bound the reactive wait between 0.8x and 1.2x of the nominal queue
    nominal = sum(sum(b + 10 for _, b, _ in PROFILES[:p + 1]) for p in range(3)) * len(GPUS)
    r = simulate(UPGRADES["TensorRT-LLM 1.2.1 -> 1.2.2"], "reactive, hard/soft keys", 0, 3, 3, 20.0, 10.0)
    assert 0.8 * nominal <= r.node_minutes - 9 * SWAP_MIN <= 1.2 * nominal
    assert r.builds == 9 and r.rechecks == 0
    p = simulate(UPGRADES["TensorRT-LLM 1.2.1 -> 1.2.2"], "planned", 0, 3, 3, 20.0, 10.0)
    assert p.node_minutes == pytest.approx(9 * SWAP_MIN) and p.builds == 9 and p.lead_min > 0
    gpu_h = sum(b / 60 * tp for _, b, tp in PROFILES) * len(GPUS)
    assert 0.8 * gpu_h <= p.build_gpu_hours <= 1.2 * gpu_h


def test_a_node_on_a_fallback_waits_only_for_the_fallback_and_two_swaps():
    assert node_wait(40.0, 30.0, None) == (SWAP_MIN, 0.0)  # engine ready before the node: one swap
    assert node_wait(10.0, 30.0, None) == pytest.approx((20.0 + SWAP_MIN, 0.0))  # no fallback: the wait
    assert node_wait(10.0, 30.0, 0.0) == pytest.approx((2 * SWAP_MIN, 20.0))  # fallback ready: there and back
    assert node_wait(10.0, 30.0, 15.0) == pytest.approx((5.0 + 2 * SWAP_MIN, 15.0))  # waits for the fallback
    assert node_wait(10.0, 30.0, 35.0) == pytest.approx((20.0 + SWAP_MIN, 0.0))  # a later fallback is never used


def test_the_fallback_mode_takes_the_bundles_work_from_their_own_keys():
    """A TensorRT-LLM upgrade leaves the vLLM bundles' key alone: every waiting node serves the
    bundle at once. A driver upgrade is soft for both: the bundles are re-checked too (18 re-checks)."""
    trt = simulate(UPGRADES["TensorRT-LLM 1.2.1 -> 1.2.2"], FALLBACK, 0, 3, 3, 20.0, 10.0)
    assert trt.node_minutes == pytest.approx(9 * 2 * SWAP_MIN) and trt.builds == 9
    without = simulate(UPGRADES["TensorRT-LLM 1.2.1 -> 1.2.2"], "reactive, hard/soft keys", 0, 3, 3, 20.0, 10.0)
    assert trt.fallback_node_minutes == pytest.approx(without.node_minutes - 9 * SWAP_MIN)
    drv = simulate(UPGRADES["driver branch 550 -> 580"], FALLBACK, 0, 3, 3, 20.0, 10.0)
    assert drv.rechecks == 18 and drv.builds == 0 and drv.fallback_node_minutes > 0
