"""Served models: one model, the runtimes that may serve it, in order of preference.

A served-model file (``build_profiles/models/<name>.yaml``) names a model and its runtimes, each an
existing build profile: the first is preferred (typically a compiled engine: TensorRT-LLM, or aoti
on CPU), the next ones are fallbacks (typically a vLLM warm-start bundle). A node whose compat key
has no usable artifact of the first runs the next one instead of idling
(:mod:`buildctl.steps.runtimes`).

The file is checked against the profiles it names, field by field: every runtime must exist, none
twice, and all must serve the same weights with the same parity prompts, so that each runtime's
attestation against the vLLM reference is evidence about the same outputs (the cross-runtime
parity a node checks before it runs a fallback).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import yaml
from pydantic import Field, ValidationError

from buildctl.core.records import Record
from buildctl.engines.errors import FieldProblem, ServedModelError, ServedModelNotFoundError
from buildctl.engines.profile import (
    SLUG_PATTERN,
    BuildProfile,
    problems_from_validation,
    read_checked_file,
    yaml_problem,
)

# The profile fields every runtime of one served model must share: the weights, and the prompts
# and tokens each is compared on against the vLLM reference (same weights + same prompts = the
# same reference outputs, so two parity verdicts speak of the same thing).
SHARED_FIELDS: tuple[str, ...] = ("model", "validation.prompt_sets", "validation.prompts_file",
                                  "validation.max_tokens", "validation.top_logprobs")

MODELS_DIR = "models"
# How long a node may serve a model from a fallback runtime before the alert fires, by default.
DEFAULT_MAX_FALLBACK_MINUTES = 240.0


class ServedModel(Record):
    """A model and the runtimes (build profiles) that may serve it, most preferred first."""

    name: str = Field(..., pattern=SLUG_PATTERN, description="The served model's name (a DNS-label-like slug): `pull --model NAME`.")
    runtimes: tuple[str, ...] = Field(..., min_length=1, description="Build profile names, most preferred first; every later one is a fallback for the ones before it.")
    max_fallback_minutes: float = Field(DEFAULT_MAX_FALLBACK_MINUTES, gt=0, le=365 * 24 * 60, allow_inf_nan=False, description="A node group on a fallback runtime longer than this raises an alert (the preferred engine's rebuild is overdue).")
    description: str | None = Field(None, max_length=500, description="Free text for listings.")

    @property
    def preferred(self) -> str:
        return self.runtimes[0]

    def rank(self, profile: str) -> int:
        """0 for the preferred runtime, 1 for the first fallback, ...; ValueError when not listed."""
        return self.runtimes.index(profile)


def _field(profile: BuildProfile, dotted: str) -> Any:
    node: Any = profile.model_dump(mode="json")
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _first_difference(a: Any, b: Any, path: str) -> str:
    """The dotted path and both values of the first leaf where ``a`` and ``b`` differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return _first_difference(a.get(k), b.get(k), f"{path}.{k}")
    return f"{path}: {a!r} vs {b!r}"


def check_runtimes(model: ServedModel, profiles: Mapping[str, BuildProfile], known: tuple[str, ...]) -> list[FieldProblem]:
    """Every problem of ``model``'s runtime list against the profiles it names."""
    problems: list[FieldProblem] = []
    seen: dict[str, int] = {}
    for i, name in enumerate(model.runtimes):
        where = f"runtimes.{i}"
        if name in seen:
            problems.append(FieldProblem(where, "runtime-once", f"{name} is listed twice (also runtimes.{seen[name]})"))
            continue
        seen[name] = i
        if name not in profiles:
            problems.append(FieldProblem(where, "runtime-is-a-profile",
                                         f"no build profile {name!r} (profiles: {', '.join(known) or 'none'})"))
    first = next((profiles[n] for n in model.runtimes if n in profiles), None)
    if first is None:
        return problems
    for i, name in enumerate(model.runtimes):
        p = profiles.get(name)
        if p is None or p is first:
            continue
        for dotted in SHARED_FIELDS:
            if _field(p, dotted) != _field(first, dotted):
                rule = "same-weights" if dotted == "model" else "same-prompts"
                problems.append(FieldProblem(
                    f"runtimes.{i}", rule,
                    f"{name} differs from {first.name} in {_first_difference(_field(first, dotted), _field(p, dotted), dotted)}: "
                    "every runtime of a served model must serve the same weights on the same parity prompts"))
    return problems


def parse_served_model(data: Any, source: str, profiles: Mapping[str, BuildProfile]) -> ServedModel:
    """Validate parsed YAML into a served model whose runtimes are among ``profiles``, or raise
    :class:`ServedModelError` (exit 2) listing every field-level problem."""
    if not isinstance(data, dict):
        raise ServedModelError(source, [FieldProblem("", "mapping", f"a served model must be a mapping, got {type(data).__name__}")])
    if "engine" in data:
        raise ServedModelError(source, [FieldProblem("engine", "not-a-profile",
                                                     "a served-model file names runtimes, not an engine: this looks like a "
                                                     "build profile (those live in the profile directory itself)")])
    try:
        model = ServedModel.model_validate(data)
    except ValidationError as err:
        problems = problems_from_validation(err)
        for p in problems:
            if p.path == "runtimes" and p.rule == "too_short":
                problems[problems.index(p)] = FieldProblem("runtimes", "at-least-one-runtime",
                                                           "the runtime list is empty: name at least one build profile")
        raise ServedModelError(source, problems) from None
    problems = check_runtimes(model, profiles, tuple(sorted(profiles)))
    if problems:
        raise ServedModelError(source, problems)
    return model


def load_served_model(path: str | Path, profiles: Mapping[str, BuildProfile]) -> ServedModel:
    """Load and check one served-model file."""
    p = Path(path)
    text = read_checked_file(p, ServedModelNotFoundError, ServedModelError)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ServedModelError(str(path), [yaml_problem(err)]) from None
    model = parse_served_model(data, str(path), profiles)
    if model.name != p.stem:
        raise ServedModelError(str(path), [FieldProblem("name", "name-is-file-name",
                                                        f"name {model.name!r} must equal the file's name ({p.stem!r})")])
    return model
