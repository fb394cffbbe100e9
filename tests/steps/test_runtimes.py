"""A node's runtime for a served model (``pull --model``): each reason a runtime is passed over,
the fallback, the move back to the preferred runtime, and "nothing fits" (exit 13) with
``current`` untouched. Engine-like trees stand in for the engine and the bundle (no preflight:
nothing is loaded), under the shipped tiny-llama served model's two profiles."""

from __future__ import annotations

import json
import os

import pytest

from buildctl.artifact_store.backends.store import open_store
from buildctl.artifact_store.channels import set_channel
from buildctl.artifact_store.layout import attestation_key
from buildctl.artifact_store.node.install_dir import current_artifact, previous_artifact
from buildctl.artifact_store.node.pull import PullOptions
from buildctl.artifact_store.publish import ManifestDraft
from buildctl.artifact_store.quarantine import quarantine
from buildctl.artifact_store.read import get_manifest
from buildctl.artifact_store.trust.attestations import write_attestation
from buildctl.artifact_store.trust.authority import Authority
from buildctl.core.errors import NoRuntimeFitsError
from buildctl.steps.context import Context
from buildctl.steps.profiles import profile_by_name, served_model_by_name
from buildctl.steps.runtimes import activate_model, pull_model, read_choices

from ..support.helpers import attestation, publish_files, rot, settings
from ..support.trtllm_kit import h100x8

ENGINE, BUNDLE = "tiny-llama-cpu", "tiny-llama-vllm-cpu"
BACKEND = {ENGINE: "aoti", BUNDLE: "vllm"}
OLD = h100x8().model_copy(update={"torch_version": "2.12.0"})  # before the upgrade: another aoti and vllm key
NEW = h100x8()
REF = "xxh3-128:" + "5" * 32  # the reference's outputs: the same vLLM reference on both sides
OPTS = PullOptions(skip_preflight=True, health_check=False)


class Fleet:
    """A store with the served model's runtimes published per host fingerprint, on staging."""

    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.store = open_store(f"file://{tmp_path / 'store'}")
        self.ctx = Context.from_settings(settings(), store=self.store).with_fingerprint(NEW)
        self.model = served_model_by_name(settings(), "tiny-llama")
        self.seed = 0
        self.preferred_key: str | None = None

    def publish(self, profile: str, fp, *, cross: list[dict] | None = None, ref: str = REF) -> str:
        self.seed += 1
        backend = BACKEND[profile]
        draft = ManifestDraft(profile_name=profile, profile_hash=profile_by_name(settings(), profile).build_hash(),
                              backend=backend, compat_key=fp.compat_key(backend), fingerprint=fp.model_dump(mode="json"),
                              model_digest="xxh3-128:" + "1" * 32)
        aid = publish_files(self.store, self.tmp / f"tree{self.seed}", draft,
                            {"config.json": f"{profile} {self.seed}".encode(), "weights.bin": 4096},
                            seed=self.seed, verdict=None)
        over = {"profile": {"name": profile, "build_hash": draft.profile_hash}, "reference_outputs_digest": ref,
                "validator_fingerprint": fp.model_dump(mode="json")}
        if profile == BUNDLE:
            over["cross_runtime"] = cross if cross is not None else self.cross()
        att = attestation(aid, fp.compat_key(backend), "pass", **over)
        att_id = write_attestation(self.store, att)
        if profile == ENGINE:
            self.preferred_key = attestation_key(aid, att.created_at, att_id)
            self.preferred_artifact = aid
        set_channel(self.store, aid, get_manifest(self.store, aid), "staging")
        return aid

    def cross(self, **changes) -> list[dict]:
        assert self.preferred_key, "publish the engine first"
        return [{"model": "tiny-llama", "preferred_profile": ENGINE, "preferred_artifact": self.preferred_artifact,
                 "preferred_attestation": self.preferred_key, "differences": [], "passed": True, **changes}]

    def pull(self, dest):
        return pull_model(self.ctx, self.model, "staging", dest, OPTS)


@pytest.fixture
def fleet(tmp_path):
    return Fleet(tmp_path)


def test_the_preferred_runtime_is_chosen_when_its_artifact_exists(fleet, tmp_path):
    engine = fleet.publish(ENGINE, NEW)
    fleet.publish(BUNDLE, NEW)
    got = fleet.pull(tmp_path / "node")
    assert (got.profile, got.rank, got.passed_over) == (ENGINE, 0, [])
    assert current_artifact(tmp_path / "node") == engine and got.why() == "the preferred runtime"


def test_no_engine_for_the_compat_key_falls_back_to_the_bundle_and_moves_back_once_the_engine_exists(fleet, tmp_path):
    fleet.publish(ENGINE, OLD)  # validated before the upgrade, for the old key only
    bundle = fleet.publish(BUNDLE, NEW)
    dest = tmp_path / "node"
    got = fleet.pull(dest)
    assert got.profile == BUNDLE and got.fallback and current_artifact(dest) == bundle
    [p] = got.passed_over
    assert (p.profile, p.kind) == (ENGINE, "no-artifact")
    assert p.reason == f"no artifact for compat key {NEW.compat_key('aoti')} on staging"
    choice = read_choices(dest)["tiny-llama"]
    assert choice["runtime"] == BUNDLE and choice["rank"] == 1 and choice["passed_over"][0]["kind"] == "no-artifact"
    since = choice["since"]
    assert fleet.pull(dest).profile == BUNDLE and read_choices(dest)["tiny-llama"]["since"] == since  # still on it

    engine = fleet.publish(ENGINE, NEW)  # the rebuild lands
    back = fleet.pull(dest)
    assert (back.profile, back.passed_over) == (ENGINE, []) and back.pull.result.installed
    assert current_artifact(dest) == engine and previous_artifact(dest) == bundle  # one atomic swap, bundle kept
    assert read_choices(dest)["tiny-llama"]["runtime"] == ENGINE


def test_a_quarantined_engine_is_passed_over_naming_the_reason(fleet, tmp_path):
    engine = fleet.publish(ENGINE, NEW)
    bundle = fleet.publish(BUNDLE, NEW)
    quarantine(fleet.store, engine, "scrub found rank0.engine rotted", auth=Authority())
    got = fleet.pull(tmp_path / "node")
    assert got.profile == BUNDLE and current_artifact(tmp_path / "node") == bundle
    [p] = got.passed_over
    assert p.kind == "quarantined" and p.reason == f"quarantined: scrub found rank0.engine rotted ({engine})"


def test_an_engine_whose_bytes_fail_verification_is_refused_and_the_bundle_installed(fleet, tmp_path):
    engine = fleet.publish(ENGINE, NEW)
    bundle = fleet.publish(BUNDLE, NEW)
    m = get_manifest(fleet.store, engine)
    rot(fleet.store, next(f.digest for f in m.files if f.path == "weights.bin"), "flip")
    got = fleet.pull(tmp_path / "node")
    assert got.profile == BUNDLE and current_artifact(tmp_path / "node") == bundle
    [p] = got.passed_over
    assert p.kind == "refused" and p.reason.startswith("refused: ") and "weights.bin" in p.reason


@pytest.mark.parametrize("case, expect", [
    ("no record", "records no parity with tiny-llama-cpu"),
    ("other reference", "reference outputs: "),
    ("other attestation", "is not an attestation of"),
    ("unreadable", "cannot be read"),
])
def test_a_bundle_without_cross_runtime_parity_is_refused_and_nothing_fits_leaves_current(fleet, tmp_path, case, expect):
    fleet.publish(ENGINE, OLD)
    first = fleet.publish(BUNDLE, NEW)
    dest = tmp_path / "node"
    fleet.pull(dest)
    assert current_artifact(dest) == first
    if case == "no record":
        fleet.publish(BUNDLE, NEW, cross=[])
    elif case == "other reference":
        fleet.publish(BUNDLE, NEW, ref="xxh3-128:" + "6" * 32)
    elif case == "other attestation":
        fleet.publish(BUNDLE, NEW, cross=fleet.cross(preferred_artifact="xxh3-128:" + "7" * 32))
    else:
        fleet.publish(BUNDLE, NEW, cross=fleet.cross(preferred_attestation=fleet.preferred_key[:-3] + "abc"))
    with pytest.raises(NoRuntimeFitsError) as err:
        fleet.pull(dest)
    reasons = dict(err.value.passed_over)
    assert reasons[ENGINE].startswith("no artifact for compat key") and expect in reasons[BUNDLE]
    assert reasons[BUNDLE].startswith("refused: no cross-runtime parity") or case == "no record"
    assert current_artifact(dest) == first  # what was installed stays


def test_the_cli_reports_the_choice_and_exits_13_naming_every_reason(fleet, tmp_path, cli, monkeypatch):
    fp_file = tmp_path / "fp.json"
    fp_file.write_text(json.dumps(NEW.model_dump(mode="json")))
    monkeypatch.setenv("BUILDCTL_FINGERPRINT_FILE", str(fp_file))
    monkeypatch.setenv("BUILDCTL_STORE", fleet.store.uri)
    dest = tmp_path / "node"
    args = ("pull", "--model", "tiny-llama", "--channel", "staging", "--dest", dest, "--skip-preflight")
    code, out, err = cli(*args)
    assert code == 3 and "store" in err and "Traceback" not in err  # an empty store is a wrong store name
    fleet.publish(ENGINE, OLD)
    code, out, err = cli(*args)
    assert code == 13 and "no runtime of served model tiny-llama fits this node" in err
    assert f"{ENGINE}: no artifact for compat key {NEW.compat_key('aoti')}" in err
    assert f"{BUNDLE}: no artifact for compat key {NEW.compat_key('vllm')}" in err and "Traceback" not in err
    assert not os.path.lexists(dest / "current")
    bundle = fleet.publish(BUNDLE, NEW)
    code, out, err = cli("--json", *args)
    assert code == 0, err
    got = json.loads(out)
    assert (got["runtime"], got["rank"], got["fallback"], got["artifact_id"]) == (BUNDLE, 1, True, bundle)
    assert got["passed_over"][0]["profile"] == ENGINE and got["passed_over"][0]["kind"] == "no-artifact"
    assert got["moved"] and got["preferred_compat_key"] == NEW.compat_key("aoti")  # what the fallback event names
    code, out, err = cli("--json", *args)
    assert code == 0 and not json.loads(out)["moved"] and json.loads(out)["since"] == got["since"]  # no new event
    code, out, err = cli(*args)
    assert code == 0 and f"passed over: no artifact for compat key" in out and "fallback #1" in out


def test_activate_model_with_nothing_staged_pulls_the_first_runtime_that_fits(fleet, tmp_path):
    fleet.publish(ENGINE, OLD)
    bundle = fleet.publish(BUNDLE, NEW)
    got = activate_model(fleet.ctx, fleet.model, tmp_path / "node", channel="staging", skip_preflight=True)
    assert got.activation is None and got.choice.profile == BUNDLE and current_artifact(tmp_path / "node") == bundle
    # the runtime event's payload names the artifact's compat key, as pull --model's does
    assert got.to_json()["runtime"] == BUNDLE and got.to_json()["compat_key"] == NEW.compat_key("vllm")
