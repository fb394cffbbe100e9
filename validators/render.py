"""The one rendering of an attestation: rows that the CLI prints as tables and the flows publish
as a Prefect table artifact, so both show the same figures, thresholds and gates."""

from __future__ import annotations

from buildctl.store.attestations import Attestation


def _gate(ok: bool) -> str:
    return "pass" if ok else "FAIL"


def headline(att: Attestation) -> list[tuple[str, str]]:
    """Key/value lines: the verdict's context."""
    p, ps = att.parity, att.prompt_set
    rows = [
        ("verdict", att.verdict.upper()),
        ("parity", f"{_gate(p.passed)}: {p.identical} identical, {p.close} close, {p.failed} failed of {p.prompts} "
                   f"prompts; max |Δlogprob| {p.max_abs_logprob_diff:.2e}"),
        ("prompt set", f"{ps.digest} ({', '.join(ps.sets)}" + (f"; skipped {', '.join(ps.skipped)}" if ps.skipped else "") + ")"),
        ("reference", str(att.versions.get("vllm"))),
        ("compat key", att.compat_key),
    ]
    rows += [("reason", r) for r in att.reasons]
    return rows


METRIC_COLUMNS = ("metric", "candidate", "reference", "ratio", "threshold", "gate")


def metric_rows(att: Attestation) -> list[dict[str, str]]:
    """One row per gated or reported metric, candidate beside the vLLM reference."""
    p, t = att.parity, att.thresholds
    rows = [{"metric": "parity (identical prompts)", "candidate": f"{p.identical}/{p.prompts}", "reference": "vLLM",
             "ratio": f"{p.identical_fraction:.2f}", "threshold": f">= {p.min_identical_fraction:.2f}, none outside top-k",
             "gate": _gate(p.passed)}]
    for lv in att.speed.levels:
        c, r, n = lv.candidate, lv.reference, lv.concurrency
        rows += [
            {"metric": f"output tok/s @ c={n}", "candidate": f"{c.output_tok_s:.1f}", "reference": f"{r.output_tok_s:.1f}",
             "ratio": f"{lv.throughput_ratio:.3f}", "threshold": f">= {t.min_throughput_ratio}",
             "gate": _gate(lv.throughput_ratio >= t.min_throughput_ratio)},
            {"metric": f"p99 TTFT ms @ c={n}", "candidate": f"{c.ttft_p99_ms:.2f}", "reference": f"{r.ttft_p99_ms:.2f}",
             "ratio": f"{lv.p99_ttft_ratio:.3f}", "threshold": f"<= {t.max_p99_ttft_ratio}",
             "gate": _gate(lv.p99_ttft_ratio <= t.max_p99_ttft_ratio)},
            {"metric": f"p50 TTFT ms @ c={n}", "candidate": f"{c.ttft_p50_ms:.2f}", "reference": f"{r.ttft_p50_ms:.2f}",
             "ratio": "", "threshold": "", "gate": "not gated"},
            {"metric": f"p50 TPOT ms @ c={n}", "candidate": f"{c.tpot_p50_ms:.2f}", "reference": f"{r.tpot_p50_ms:.2f}",
             "ratio": "", "threshold": "", "gate": "not gated"},
            {"metric": f"tok/s CV @ c={n}", "candidate": f"{c.output_tok_s_cv:.2f}", "reference": f"{r.output_tok_s_cv:.2f}",
             "ratio": "", "threshold": "", "gate": "not gated"},
        ]
    return rows
