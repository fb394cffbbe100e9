"""vLLM's parity rule on synthetic token and logprob sequences."""

from __future__ import annotations

import pytest

from buildctl.engines.backend import Generation
from buildctl.validators.parity import check_parity, compare


def G(tokens, tops=None):
    return Generation(list(tokens), tops if tops is not None else [{t: -0.1} for t in tokens])


def test_identical():
    r = compare(0, G([1, 2, 3]), G([1, 2, 3]))
    assert r.status == "identical" and r.passed and r.position is None and r.compared == 3


def test_divergence_within_both_top_k_is_close_and_stops_comparing():
    ref = G([1, 2, 3, 4], [{1: -0.1}, {2: -0.5, 9: -0.6}, {3: -0.1}, {4: -0.1}])
    cand = G([1, 9, 7, 7], [{1: -0.1}, {9: -0.55, 2: -0.58}, {7: -0.1}, {7: -0.1}])
    r = compare(0, ref, cand)
    assert (r.status, r.position, r.reference_token, r.candidate_token) == ("close", 1, 2, 9)
    assert r.passed and r.compared == 2  # positions after the divergence are not compared


def test_divergence_outside_top_k_fails():
    ref = G([1, 2], [{1: -0.1}, {2: -0.1, 5: -3.0}])
    cand = G([1, 9], [{1: -0.1}, {9: -0.1, 5: -2.0}])
    r = compare(0, ref, cand)
    assert (r.status, r.position) == ("failed", 1) and not r.passed


def test_one_sided_top_k_is_not_enough():
    ref = G([1, 2], [{1: -0.1}, {2: -0.1, 9: -0.2}])  # ref knows 9 ...
    cand = G([1, 9], [{1: -0.1}, {9: -0.1, 4: -0.2}])  # ... but cand's top-k lacks 2
    assert compare(0, ref, cand).status == "failed"


def test_length_mismatch_fails():
    assert compare(0, G([1, 2, 3]), G([1, 2])).status == "failed"


def test_max_logprob_diff_over_common_prefix():
    ref = G([1, 2, 3], [{1: -0.1, 4: -2.0}, {2: -0.2}, {3: -0.3, 8: -1.0}])
    cand = G([1, 2, 7], [{1: -0.15, 4: -2.5}, {2: -0.2}, {7: -0.3, 3: -0.4}])
    r = compare(0, ref, cand)
    assert (r.status, r.position) == ("failed", 2)
    assert r.max_abs_logprob_diff == pytest.approx(0.5)  # position 2 (the divergence) is not in the prefix


def test_gate():
    ref = [G([1, 2]), G([3, 4]), G([5, 6], [{5: -0.1}, {6: -0.1, 7: -0.2}])]
    cand = [G([1, 2]), G([3, 4]), G([5, 7], [{5: -0.1}, {7: -0.1, 6: -0.2}])]
    rep = check_parity(ref, cand, 0.0)
    assert rep.passed and rep.identical_fraction == pytest.approx(2 / 3)
    strict = check_parity(ref, cand, 1.0)
    assert not strict.passed and "only 67% of prompts identical" in strict.reasons()[0]
    bad = check_parity(ref, [G([1, 2]), G([3, 9]), G([5, 6])], 0.0)
    assert not bad.passed and bad.reasons() == ["prompt 1 diverged at position 1 (reference 4, candidate 9) outside the top-k"]
    with pytest.raises(ValueError):
        check_parity(ref, cand[:2])
