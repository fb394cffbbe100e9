"""Cross-runtime parity: what a fallback's validation is compared with (the preferred runtime's
passing validations, found through the pair index), the record it writes, and the comparison."""

from __future__ import annotations

from buildctl.artifact_store.quarantine import quarantine
from buildctl.artifact_store.trust.attestations import parity_basis_differences
from buildctl.artifact_store.trust.authority import Authority
from buildctl.validators.validate import cross_runtime_records
from buildctl.steps.fallback import preferred_validations

from ..support.helpers import attestation
from .test_runtimes import BUNDLE, ENGINE, NEW, OLD, REF, Fleet


def att(**over):
    return attestation("xxh3-128:" + "9" * 32, "k", "pass", **{"reference_outputs_digest": REF, **over})


def test_the_same_weights_prompts_and_reference_outputs_show_parity_and_each_difference_is_named():
    assert parity_basis_differences(att(), att()) == []
    prompts = att().prompt_set.model_copy(update={"digest": "xxh3-128:" + "8" * 32}).model_dump()
    failed = att().parity.model_copy(update={"passed": False}).model_dump()
    cases = {"model digest": att(model_digest="xxh3-128:" + "3" * 32), "prompt set": att(prompt_set=prompts),
             "reference outputs: xxh3": att(reference_outputs_digest="xxh3-128:" + "4" * 32),
             "reference outputs: not recorded by the fallback validation": att(reference_outputs_digest=None),
             "the fallback runtime did not pass parity": att(parity=failed)}
    for expect, other in cases.items():
        diffs = parity_basis_differences(att(), other)
        assert len(diffs) == 1 and diffs[0].startswith(expect), (expect, diffs)
    assert parity_basis_differences(att(reference_outputs_digest=None), att())[0].startswith(
        "reference outputs: not recorded by the preferred validation")


def test_a_fallback_is_compared_with_the_preferred_runtimes_passing_validations_not_quarantined_ones(tmp_path):
    fleet = Fleet(tmp_path)
    assert preferred_validations(fleet.ctx, ENGINE) == ()  # the engine is no fallback
    assert preferred_validations(fleet.ctx, BUNDLE) == ()  # nothing validated yet
    old = fleet.publish(ENGINE, OLD)
    new = fleet.publish(ENGINE, NEW)
    found = preferred_validations(fleet.ctx, BUNDLE)
    assert [p.artifact_id for p in found] == [new, old] and {p.model for p in found} == {"tiny-llama"}
    assert found[0].key == fleet.preferred_key
    quarantine(fleet.store, new, "rotted", auth=Authority())
    assert [p.artifact_id for p in preferred_validations(fleet.ctx, BUNDLE)] == [old]

    # the record: the first preferred validation that shows the same reference wins, else the newest
    other_ref = fleet.publish(ENGINE, NEW, ref="xxh3-128:" + "6" * 32)
    found = preferred_validations(fleet.ctx, BUNDLE)
    assert [p.artifact_id for p in found] == [other_ref, old]
    [rec] = cross_runtime_records(found, att())
    assert rec.passed and rec.preferred_artifact == old and rec.differences == ()
    [rec] = cross_runtime_records(found[:1], att())
    assert not rec.passed and rec.differences[0].startswith("reference outputs: ")
