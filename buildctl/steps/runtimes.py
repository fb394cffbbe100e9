"""A node's runtime for a served model: the first of its runtimes that fits, else the next.

``buildctl pull --model NAME`` (and ``node activate --model``) walks the served model's runtimes
in order (:mod:`buildctl.engines.served`). For each it resolves the channel's artifact for this
node's compat key and passes it over, with the reason, when:

* ``no artifact for compat key K``: the channel has no ref for the node's key (not built yet after
  a driver upgrade, a new GPU model);
* ``quarantined: REASON``: the artifact is quarantined;
* ``refused: CHECK``: a fallback without cross-runtime parity with the preferred runtime
  (:func:`buildctl.steps.fallback.fallback_refusal`), or any check of the pull itself (bytes,
  signatures, freshness, coverage, preflight, smoke check).

The first runtime that passes is installed as a pull installs (verified, swapped atomically into
``DIR/current``, the previous version kept); a node on a fallback moves back to the preferred
runtime on the first pull after its artifact exists. When none fits, :class:`NoRuntimeFitsError`
(exit 13) names every reason, and ``DIR/current`` stays as it was. ``DIR/served-model.json`` says
which runtime a model runs here, since when, and why the earlier ones were passed over.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

from buildctl.artifact_store.backends.store import ProgressFn
from buildctl.artifact_store.errors import ChannelNotFoundError
from buildctl.artifact_store.fleet.inventory import EngineState
from buildctl.artifact_store.node.install_dir import write_atomic
from buildctl.artifact_store.node.pull import PullOptions, resolve_channel
from buildctl.artifact_store.quarantine import active_quarantine
from buildctl.artifact_store.read import get_manifest
from buildctl.core.errors import GateRefusedError, IntegrityError, NoRuntimeFitsError, PreflightRefusedError
from buildctl.core.times import utc_now
from buildctl.engines.served import ServedModel
from buildctl.steps import node_agent
from buildctl.steps.context import Context
from buildctl.steps.fallback import fallback_refusal
from buildctl.steps.host import host_compat_keys
from buildctl.steps.profiles import profile_by_name

Kind = Literal["no-artifact", "quarantined", "refused"]
CHOICE_FILE = "served-model.json"


@dataclass(frozen=True)
class PassedOver:
    """A runtime a node did not choose, and why."""

    profile: str
    kind: Kind
    reason: str


@dataclass
class ModelPull:
    """What ``pull --model`` chose and did."""

    model: ServedModel
    profile: str
    passed_over: list[PassedOver] = field(default_factory=list)
    pull: node_agent.NodePull | None = None
    moved: bool = False  # the model runs another runtime here than before (or its first)
    since: str | None = None  # when it started to run this runtime here
    preferred_compat_key: str | None = None  # this node's key for the preferred runtime: its node group

    @property
    def rank(self) -> int:
        return self.model.rank(self.profile)

    @property
    def fallback(self) -> bool:
        return self.rank > 0

    def why(self) -> str:
        if not self.fallback:
            return "the preferred runtime"
        return f"fallback #{self.rank}: " + "; ".join(f"{p.profile} {p.reason}" for p in self.passed_over)

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model.name, "runtime": self.profile, "rank": self.rank, "fallback": self.fallback,
                "why": self.why(), "since": self.since, "moved": self.moved,
                "preferred_compat_key": self.preferred_compat_key,
                "passed_over": [{"profile": p.profile, "kind": p.kind, "reason": p.reason} for p in self.passed_over]}


def _one_line(err: BaseException, limit: int = 400) -> str:
    """The error on one line (a multi-line message's lines joined), at most ``limit`` characters."""
    text = "; ".join(line.strip() for line in str(err).splitlines() if line.strip()) or type(err).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def pull_model(ctx: Context, model: ServedModel, channel: str, dest: str | Path, options: PullOptions = PullOptions(),
               *, on_bytes: ProgressFn | None = None, on_health: Callable[[EngineState], None] | None = None,
               on_pass: Callable[[PassedOver], None] | None = None) -> ModelPull:
    """Install the first runtime of ``model`` that fits this node (see the module docstring);
    :class:`NoRuntimeFitsError` (exit 13) when none does, with ``current`` as it was. ``on_pass``
    is called for each runtime passed over, as it is."""
    dest = Path(dest)
    fp = ctx.fingerprint
    keys = host_compat_keys(fp)
    passed: list[PassedOver] = []

    def pass_over(profile: str, kind: Kind, reason: str) -> None:
        p = PassedOver(profile, kind, reason)
        passed.append(p)
        if on_pass is not None:
            on_pass(p)

    for rank, name in enumerate(model.runtimes):
        backend = profile_by_name(ctx.settings, name).engine.backend
        try:
            rec = resolve_channel(ctx.store, name, channel, keys)
        except ChannelNotFoundError:
            pass_over(name, "no-artifact", f"no artifact for compat key {fp.compat_key(backend)} on {channel}")
            continue
        artifact_id = rec.artifact_for(options.node_id)
        active = active_quarantine(ctx.store, artifact_id)
        if active is not None:
            pass_over(name, "quarantined", f"quarantined: {active[1].reason} ({artifact_id})")
            continue
        if rank > 0:
            refusal = fallback_refusal(ctx, model, rec, artifact_id)
            if refusal is not None:
                pass_over(name, "refused", f"refused: {refusal}")
                continue
        try:
            got = node_agent.pull(ctx, name, channel, dest, options, on_bytes=on_bytes, on_health=on_health,
                                  target=(rec, get_manifest(ctx.store, artifact_id)))
        except (IntegrityError, GateRefusedError, PreflightRefusedError) as err:
            pass_over(name, "refused", f"refused: {_one_line(err)}")
            continue
        chosen = ModelPull(model, name, passed, got, preferred_compat_key=_preferred_key(ctx, model))
        record_choice(dest, chosen)
        return chosen
    raise NoRuntimeFitsError(model.name, [(p.profile, p.reason) for p in passed])


def _preferred_key(ctx: Context, model: ServedModel) -> str:
    return ctx.fingerprint.compat_key(profile_by_name(ctx.settings, model.preferred).engine.backend)


def record_choice(dest: Path, chosen: ModelPull) -> None:
    """Keep ``DIR/served-model.json``: the runtime each model runs here, since when (kept while the
    runtime stays the same) and why; set ``chosen.moved`` and ``chosen.since``. Not kept (a full
    disk) costs only the record, not the install."""
    state = read_choices(dest)
    before = state.get(chosen.model.name, {})
    chosen.moved = before.get("runtime") != chosen.profile
    chosen.since = (None if chosen.moved else before.get("since")) or utc_now()
    state[chosen.model.name] = {**chosen.to_json(), "since": chosen.since,
                                "artifact_id": chosen.pull.result.artifact_id if chosen.pull else None}
    try:
        write_atomic(dest / CHOICE_FILE, json.dumps(state, sort_keys=True, indent=1).encode())
    except OSError:
        pass


def read_choices(dest: str | Path) -> dict[str, dict[str, Any]]:
    """``DIR/served-model.json`` as a mapping by model (empty when absent or unreadable)."""
    try:
        data = json.loads((Path(dest) / CHOICE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


@dataclass
class ModelActivation:
    """What ``node activate --model`` chose and did: a staged runtime swapped in, or a pull."""

    choice: ModelPull
    activation: node_agent.Activation | None  # None: nothing was staged, so it pulled (choice.pull)
    note: str | None = None  # why the store's checks of a staged fallback could not run

    def to_json(self) -> dict[str, Any]:
        pulled = self.choice.pull
        base = self.activation.to_json() if self.activation is not None else {
            "artifact_id": pulled.result.artifact_id if pulled else None,
            "activated": bool(pulled and pulled.result.installed), "from_staged": False,
            "compat_key": pulled.record.compat_key if pulled else None}
        return {**base, **self.choice.to_json(), "fallback_check_note": self.note}


def activate_model(ctx: Context, model: ServedModel, dest: str | Path, *, channel: str = node_agent.DEFAULT_CHANNEL,
                   node_id: str | None = None, skip_preflight: bool = False) -> ModelActivation:
    """After an upgrade: swap ``current`` to the first runtime of ``model`` staged for this host's
    compat key (``node_agent.activate``: offline). A staged fallback is checked for cross-runtime
    parity when the store answers at once (the note says when it did not). With no runtime staged,
    pull as ``pull --model`` does. :class:`NoRuntimeFitsError` when every staged one is refused."""
    from buildctl.artifact_store.backends.store import fail_fast
    from buildctl.artifact_store.errors import StoreNotFoundError
    from buildctl.artifact_store.node.install_dir import staged_engines
    from buildctl.core.errors import UnavailableError

    dest = Path(dest)
    keys = host_compat_keys(ctx.fingerprint)
    passed: list[PassedOver] = []
    note = None
    any_staged = False
    for rank, name in enumerate(model.runtimes):
        staged = sorted((e for e in staged_engines(dest) if e.record.profile == name and e.compat_key in keys
                         and e.record.channel == channel), key=lambda e: (keys.index(e.compat_key), -e.record.seq))
        backend = profile_by_name(ctx.settings, name).engine.backend
        if not staged:
            passed.append(PassedOver(name, "no-artifact", f"nothing staged for compat key "
                                                          f"{ctx.fingerprint.compat_key(backend)} from {channel}"))
            continue
        any_staged = True
        if rank > 0:
            try:
                refusal = fallback_refusal(ctx.with_store(fail_fast(ctx.store)).with_fingerprint(ctx.fingerprint), model,
                                           staged[0].record,
                                           staged[0].artifact_id)
            except (UnavailableError, StoreNotFoundError) as err:
                refusal, note = None, f"could not check cross-runtime parity in the store ({err})"
            if refusal is not None:
                passed.append(PassedOver(name, "refused", f"refused: {refusal}"))
                continue
        try:
            got = node_agent.activate(ctx, name, dest, channel=channel, node_id=node_id, skip_preflight=skip_preflight)
        except (IntegrityError, GateRefusedError, PreflightRefusedError) as err:
            passed.append(PassedOver(name, "refused", f"refused: {_one_line(err)}"))
            continue
        chosen = ModelPull(model, name, passed, node_agent.NodePull(got.result, got.result.record, None),
                           preferred_compat_key=_preferred_key(ctx, model))
        record_choice(dest, chosen)
        return ModelActivation(chosen, got, note)
    if any_staged:
        raise NoRuntimeFitsError(model.name, [(p.profile, p.reason) for p in passed])
    return ModelActivation(pull_model(ctx, model, channel, dest, PullOptions(node_id=node_id,
                                                                           skip_preflight=skip_preflight)), None)
