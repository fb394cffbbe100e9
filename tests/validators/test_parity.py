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


# --- boundaries the mutation run found unchecked (#20) -------------------------------------------

def _g(tokens, tops=None):
    from buildctl.engines.backend import Generation

    return Generation(token_ids=list(tokens), top_logprobs=list(tops or []))


def test_identical_fraction_exactly_at_the_minimum_passes():
    from buildctl.validators.parity import check_parity

    same, close = _g([1, 2], [{1: -0.1}, {2: -0.1}]), _g([1, 3], [{1: -0.1}, {3: -0.2, 2: -0.3}])
    ref_close = _g([1, 2], [{1: -0.1}, {2: -0.1, 3: -0.4}])
    rep = check_parity([same, ref_close], [same, close], min_identical_fraction=0.5)
    assert rep.identical_fraction == 0.5 and rep.passed and rep.reasons() == []
    strict = check_parity([same, ref_close], [same, close], min_identical_fraction=0.51)
    assert not strict.passed and strict.reasons() == ["only 50% of prompts identical, profile requires 51%"]
    d = rep.to_json()
    assert (d["identical"], d["close"], d["failed"], d["prompts"]) == (1, 1, 0, 2)


def test_missing_top_logprobs_and_early_stops():
    from buildctl.validators.parity import check_parity, compare

    # fewer top-k entries than tokens: no index error; a divergence with no top-k to match is a failure
    p = compare(0, _g([1, 2, 3], [{1: -0.1}]), _g([1, 2, 4], [{1: -0.1}]))
    assert (p.status, p.position, p.compared, p.reference_token, p.candidate_token) == ("failed", 2, 3, 3, 4)
    # one side stops early with an equal prefix: failed at the shorter length
    p = compare(0, _g([1, 2, 3]), _g([1, 2]))
    assert (p.status, p.position, p.compared) == ("failed", 2, 2)
    assert compare(0, _g([1, 2]), _g([1, 2])).status == "identical"
    assert compare(0, _g([]), _g([])).status == "identical"
    empty = check_parity([], [])
    assert empty.identical_fraction == 0.0 and empty.max_abs_logprob_diff == 0.0 and empty.passed
    with pytest.raises(ValueError, match="2 reference outputs but 1 candidate"):
        check_parity([_g([1]), _g([1])], [_g([1])])


def test_max_abs_logprob_diff_is_over_shared_top_k_tokens_of_the_common_prefix():
    from buildctl.validators.parity import check_parity, compare

    r = _g([5, 6, 7], [{5: -0.10, 9: -3.0}, {6: -0.50, 8: -1.0}, {7: -0.2, 8: -0.9}])
    c = _g([5, 6, 8], [{5: -0.35, 10: -2.0}, {6: -0.45, 8: -1.3}, {8: -0.1, 7: -0.15}])
    p = compare(0, r, c)
    # positions 0 and 1 are compared before the divergence at 2: |-0.10+0.35| = 0.25, |-0.5+0.45|, |-1+1.3| = 0.3
    assert p.status == "close" and p.position == 2 and p.max_abs_logprob_diff == pytest.approx(0.3)
    assert p.passed
    small = compare(1, _g([5], [{5: -0.10}]), _g([5], [{5: -0.12}]))
    assert small.max_abs_logprob_diff == pytest.approx(0.02)
    assert check_parity([r, _g([5], [{5: -0.10}])], [c, _g([5], [{5: -0.12}])]).max_abs_logprob_diff == pytest.approx(0.3)


def test_report_counts_and_defaults():
    """The report's counts per status, its fraction over one prompt, and the gate's default minimum
    (0: a 'close' prompt alone passes)."""
    ref = [G([1, 2]), G([1, 2]), G([3]), G([1, 2], [{1: -0.1}, {2: -0.1, 9: -0.2}]), G([1, 2])]
    cand = [G([1, 2]), G([1, 2]), G([3]), G([1, 9], [{1: -0.1}, {9: -0.1, 2: -0.2}]), G([5, 5])]
    d = check_parity(ref, cand).to_json()
    assert (d["prompts"], d["identical"], d["close"], d["failed"]) == (5, 3, 1, 1)
    assert d["identical_fraction"] == 0.6 and d["max_abs_logprob_diff"] == 0.0
    no_shared_top_k = compare(0, G([1, 2], [{}, {}]), G([1, 2], [{}, {}]))
    assert no_shared_top_k.max_abs_logprob_diff == 0.0
    one = check_parity([G([1, 2])], [G([1, 2])])
    assert one.identical_fraction == 1.0 and one.max_abs_logprob_diff == 0.0
    close_only = check_parity([ref[3]], [cand[3]])
    assert close_only.passed and close_only.identical_fraction == 0.0 and close_only.min_identical_fraction == 0.0


def test_results_are_frozen():
    import dataclasses

    r = compare(0, G([1]), G([1]))
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.status = "failed"  # type: ignore[misc]
    rep = check_parity([G([1])], [G([1])])
    with pytest.raises(dataclasses.FrozenInstanceError):
        rep.min_identical_fraction = 0.0  # type: ignore[misc]


def test_the_staggered_set_gives_each_prompt_its_own_length_and_arrival():
    from buildctl.validators.parity import staggered_requests

    reqs = staggered_requests([[i + 1] for i in range(10)], 32)
    assert [r.max_tokens for r in reqs] == [1, 2, 8, 16, 32] * 2
    assert [r.arrival for r in reqs] == [(i * 7) % 13 for i in range(10)] and len({r.arrival for r in reqs}) == 10
    assert [r.prompt for r in reqs] == [[i + 1] for i in range(10)]
    # short runs: each length at least 1 and none past max_tokens
    assert [r.max_tokens for r in staggered_requests([[1]] * 5, 2)] == [1, 2, 1, 1, 2]
    assert [r.max_tokens for r in staggered_requests([[1]] * 5, 1)] == [1, 1, 1, 1, 1]


def test_the_staggered_concurrencies_are_the_ones_docs_validation_md_gives():
    import re

    from buildctl.validators.parity import STAGGERED_CONCURRENCY

    from ..support.helpers import REPO

    text = (REPO / "docs" / "validation.md").read_text()
    (a, b), = re.findall(r"staggered set at concurrencies (\d+) and (\d+)", text)
    assert STAGGERED_CONCURRENCY == (int(a), int(b))


def test_a_staggered_output_is_compared_with_the_solo_reference_cut_to_its_length():
    from buildctl.engines.batching import Request
    from buildctl.validators.parity import check_staggered, staggered_json

    ref = [Generation([1, 2, 3, 4], [{1: -0.1}, {2: -0.1}, {3: -0.1}, {4: -0.1}]),
           Generation([5, 6, 7, 8], [{5: -0.1}, {6: -0.1}, {7: -0.1, 9: -2.0}, {8: -0.1}])]
    reqs = [Request([1], 2), Request([2], 3)]
    good = check_staggered(ref, [Generation([1, 2], [{1: -0.1}, {2: -0.1}]),
                                 Generation([5, 6, 7], [{5: -0.1}, {6: -0.1}, {7: -0.1}])], reqs, 1.0)
    assert good.passed and good.identical_fraction == 1.0
    # a request that ran past its max_tokens, or diverged outside the top-k, fails
    bad = check_staggered(ref, [Generation([1, 2, 3], [{1: -0.1}, {2: -0.1}, {3: -0.1}]),
                                Generation([5, 6, 0], [{5: -0.1}, {6: -0.1}, {0: -0.1}])], reqs, 0.0)
    assert [p.status for p in bad.prompts] == ["failed", "failed"] and not bad.passed
    # by default a close output (diverged within both top-k) passes, as check_parity's default does
    close = check_staggered(ref, [Generation([1, 2], [{1: -0.1}, {2: -0.1}]),
                                  Generation([5, 6, 9], [{5: -0.1}, {6: -0.1}, {9: -0.1, 7: -0.3}])], reqs)
    assert [p.status for p in close.prompts] == ["identical", "close"] and close.passed
    rec = staggered_json(5, bad)
    assert rec["concurrency"] == 5 and rec["failed"] == 2 and rec["prompts"] == 2 and len(rec["per_prompt"]) == 2


def test_promote_recomputes_a_failed_staggered_run_as_a_failure():
    from buildctl.artifact_store.trust.attestations import recomputed_verdict

    from ..support.helpers import attestation

    run = {"concurrency": 5, "prompts": 1, "identical": 1, "close": 0, "failed": 0, "max_abs_logprob_diff": 0.0,
           "per_prompt": [{"index": 0, "status": "identical", "compared": 16}]}
    base = attestation("xxh3-128:" + "a" * 32, "aoti-x").parity.model_dump(mode="json")
    ok = attestation("xxh3-128:" + "a" * 32, "aoti-x", parity={**base, "staggered": [run]})
    assert recomputed_verdict(ok) == ("pass", [])
    failed = {**run, "identical": 0, "failed": 1,
              "per_prompt": [{"index": 0, "status": "failed", "compared": 3, "position": 2}]}
    bad = attestation("xxh3-128:" + "a" * 32, "aoti-x", parity={**base, "staggered": [run, {**failed, "concurrency": 17}]})
    verdict, reasons = recomputed_verdict(bad)
    assert verdict == "fail" and reasons == ["parity at concurrency 17 (staggered): prompts [0] diverged outside the top-k"]
    missing = attestation("xxh3-128:" + "a" * 32, "aoti-x", parity={**base, "staggered": [{**run, "per_prompt": []}]})
    assert recomputed_verdict(missing)[0] == "fail"
