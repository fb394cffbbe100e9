"""The upgrade simulation: its decisions are buildctl's own, and cases with a closed-form answer."""

from __future__ import annotations

import pytest

from benchmarks.upgrade import GPUS, PROFILES, SWAP_MIN, UPGRADES, host, simulate, work_for


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
