"""Build provenance (#33 item 2): every build writes an in-toto Statement v1 with a SLSA Provenance
v1 predicate, signed by the builder key, stored create-only beside the manifest; `show --provenance`
prints it; promote to prod requires it, with the inputs of the promoter's profile.

The schemas: in-toto's own Statement and ResourceDescriptor protos (in-toto/attestation
protos/in_toto_attestation/v1/statement.proto, resource_descriptor.proto, through the
in-toto-attestation package's generated bindings and its ``Statement.validate``) and the SLSA
Provenance v1 predicate proto (in-toto/attestation
protos/in_toto_attestation/predicates/provenance/v1/provenance.proto, the machine-readable form of
slsa-framework/slsa spec/schema/provenance.cue). Parsing is strict: an unknown field, a wrong type
or a timestamp that is not RFC 3339 fails.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from google.protobuf import json_format

from buildctl.artifact_store.gc import gc
from buildctl.artifact_store.read import get_manifest
from buildctl.artifact_store.trust.authority import Authority
from buildctl.artifact_store.errors import PromotionRefusedError
from buildctl.artifact_store.layout import provenance_key
from buildctl.artifact_store.trust.provenance import BUILD_TYPE, PREDICATE_TYPE, read_provenance
from buildctl.artifact_store.trust.signing import TrustedKeys
from buildctl.steps.context import Context
from buildctl.core.digest import crypto_bytes, hex_of

from ...support.helpers import (
    PROFILES,
    make_signer,
    make_tree,
    publish_files,
    settings,
    staged,
    write_attestation,
    write_build_provenance,
)
from buildctl.artifact_store.gc import GcPolicy


def schema_problems(stmt: dict) -> list[str]:
    """Why ``stmt`` is not a valid in-toto Statement v1 with a SLSA Provenance v1 predicate (empty: it is)."""
    from in_toto_attestation.predicates.provenance.v1 import provenance_pb2
    from in_toto_attestation.v1 import statement_pb2
    from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor
    from in_toto_attestation.v1.statement import Statement

    problems = []
    try:
        pb = json_format.Parse(json.dumps(stmt), statement_pb2.Statement())
        Statement.copy_from_pb(pb).validate()
    except (json_format.ParseError, ValueError) as err:
        return [f"statement: {err}"]
    if stmt.get("predicateType") != PREDICATE_TYPE:
        problems.append(f"predicateType {stmt.get('predicateType')!r}")
    try:
        prov = json_format.ParseDict(stmt["predicate"], provenance_pb2.Provenance())
    except (json_format.ParseError, KeyError) as err:
        return problems + [f"predicate: {err}"]
    # SLSA Provenance v1's REQUIRED fields (slsa.dev/spec/v1.0/provenance)
    if not prov.build_definition.build_type:
        problems.append("buildDefinition.buildType is required")
    if not prov.build_definition.HasField("external_parameters"):
        problems.append("buildDefinition.externalParameters is required")
    if not prov.run_details.builder.id:
        problems.append("runDetails.builder.id is required")
    for rd in [*prov.build_definition.resolved_dependencies, *prov.run_details.byproducts,
               *prov.run_details.builder.builder_dependencies]:
        try:
            ResourceDescriptor.copy_from_pb(rd).validate()
        except ValueError as err:
            problems.append(str(err))
    return problems


def test_the_schema_check_can_fail():
    """The validator used below is not vacuous: each of these breaks one rule of the schemas."""
    good = {"_type": "https://in-toto.io/Statement/v1", "subject": [{"name": "a", "digest": {"blake3": "00"}}],
            "predicateType": PREDICATE_TYPE,
            "predicate": {"buildDefinition": {"buildType": "x", "externalParameters": {"a": 1}},
                          "runDetails": {"builder": {"id": "urn:x"}}}}
    assert schema_problems(good) == []
    bad = [
        {**good, "_type": "https://in-toto.io/Statement/v0.1"},
        {**good, "subject": [{"name": "a"}]},  # a subject needs a digest
        {**good, "subjects": good["subject"]},  # unknown field
        {**good, "predicate": {**good["predicate"], "runDetails": {"builder": {}}}},  # builder.id required
        {**good, "predicate": {**good["predicate"], "runDetails": {"builder": {"id": "urn:x"},
                                                                  "metadata": {"startedOn": "yesterday"}}}},
        {**good, "predicate": {**good["predicate"], "runDetails": {"builder": {"id": "urn:x", "version": {"a": 1}}}}},
        {**good, "predicate": {**good["predicate"], "extra": 1}},
    ]
    for stmt in bad:
        assert schema_problems(stmt), stmt


def _build(tmp_path: Path, ctx: Context, *, seed: int = 1, calibration: bool = False):
    """build.publish over an engine tree made here (the real aoti build is the slow test
    below): a plan for the tiny profile and a small checkpoint directory."""
    from buildctl.steps import build
    from buildctl.artifact_store.manifest import tree_digests, tree_stat
    from buildctl.engines.buildkey import build_key_for
    from buildctl.engines.fingerprint import detect
    from buildctl.engines.profile import load_profile
    from buildctl.core.times import utc_now

    profile = load_profile(PROFILES / "tiny-llama-cpu.yaml")
    fp = detect()
    model = make_tree(tmp_path / f"model{seed}", {"config.json": b'{"model_type": "llama"}', "model.safetensors": 4096},
                      seed=seed)
    stamps = tree_stat(model)
    digest, blake3 = tree_digests(model)
    plan = build.BuildPlan(profile, fp, model, digest, blake3, stamps, build_key_for(profile, digest, fp),
                              fp.compat_key(profile.engine.backend), None)
    run = tmp_path / f"run{seed}"
    engine = make_tree(run / "engine", {"model.pt2": 70_000, "record.json": b"{}"}, seed=seed)
    (run / "build.log").write_text("$ python -m buildctl.engines.aoti.compile\nok\n")
    cmd = (("python", "-m", "buildctl.engines.aoti.compile", "--model", str(model)),)
    built = build.BuiltEngine(plan, run, engine, run / "build.log", 1.0, {"torch": "2.13.0"}, cmd, utc_now(), utc_now())
    return build.publish(ctx, built), plan


@pytest.fixture
def ctx(store, tmp_path):
    return Context.from_settings(settings(profile_dir=PROFILES), store=store, auth=Authority(who="ci@builder-1"))


def test_a_build_writes_provenance_that_validates_and_names_its_inputs(ctx, store, tmp_path, cli):
    signer = make_signer()
    pub, plan = _build(tmp_path, Context(ctx.settings, store, ctx.auth.but(signer=signer)))
    aid = pub.artifact_id
    code, out, err = cli("--store", store.uri, "show", aid, "--provenance")
    assert code == 0, err
    stmt = json.loads(out)
    assert schema_problems(stmt) == []
    assert f"signed by {signer.key_id} (not checked: no trusted keys)" in err
    body = store.get_bytes(f"manifests/{hex_of(aid)}.json")
    m = get_manifest(store, aid)
    manifest_subject, *files = stmt["subject"]
    assert manifest_subject["name"] == aid
    assert manifest_subject["digest"]["blake3"] == crypto_bytes(body).split(":")[1]
    assert {f["name"]: f["digest"] for f in files} == {
        f.path: {"blake3": f.blake3.split(":")[1], "xxh3_128": hex_of(f.digest)} for f in m.files}
    pred = stmt["predicate"]
    assert pred["buildDefinition"]["buildType"] == BUILD_TYPE
    assert pred["buildDefinition"]["externalParameters"] == {"profile": "tiny-llama-cpu", "backend": "aoti",
                                                             "compatKey": m.compat_key}
    deps = {d["name"]: d for d in pred["buildDefinition"]["resolvedDependencies"]}
    assert deps["model"]["digest"]["xxh3_128"] == hex_of(plan.model_digest) == hex_of(m.model_digest)
    assert deps["profile"]["digest"]["xxh3_128"] == hex_of(m.profile_hash)
    assert deps["profile"]["uri"].endswith("tiny-llama-cpu.yaml")
    assert "calibration" not in deps  # the tiny profile has none
    assert deps["model"]["annotations"] == {"tree": "path, size, digest and mode of every file"}
    assert pred["buildDefinition"]["internalParameters"]["commands"][0][:3] == ["python", "-m", "buildctl.engines.aoti.compile"]
    assert pred["buildDefinition"]["internalParameters"]["buildKey"] == m.build_key
    run = pred["runDetails"]
    assert run["builder"]["id"] == "urn:buildctl:builder:ci@builder-1"
    assert run["builder"]["version"]["torch"] == "2.13.0" and run["builder"]["version"]["buildctl"]
    (host,) = run["builder"]["builderDependencies"]
    assert host["annotations"] == m.fingerprint
    assert run["byproducts"] == [{"name": "build.log", "mediaType": "text/plain",
                                  "digest": {"xxh3_128": hex_of(m.build_log), "blake3": m.build_log_blake3.split(":")[1]}}]
    # create-only: the same bytes built again keep the first provenance
    first = store.get_bytes(provenance_key(aid))
    again, _ = _build(tmp_path / "again", Context(ctx.settings, store, ctx.auth.but(signer=make_signer())))
    assert again.artifact_id != aid or store.get_bytes(provenance_key(aid)) == first


def test_a_checkpoint_changed_during_the_build_publishes_nothing(ctx, store, tmp_path, monkeypatch):
    from buildctl.steps import build
    from buildctl.engines.errors import ModelSourceError

    real = build.tree_stat

    def changed(path):
        (Path(path) / "model.safetensors").write_bytes(b"swapped")  # the checkpoint changes under the build
        return real(path)

    monkeypatch.setattr(build, "tree_stat", changed)
    with pytest.raises(ModelSourceError, match="changed during the build"):
        _build(tmp_path, ctx)
    assert list(store.list("manifests/")) == []


def test_a_build_reads_its_checkpoint_once_and_a_file_changed_since_is_caught_by_its_stat(ctx, tmp_path,
                                                                                          monkeypatch):
    """#51: one read of the checkpoint computes both digests the build records (the build key's
    xxh3 tree digest and provenance's BLAKE3); after the build, a stat of every file (size, mtime,
    inode, ctime) stands in for the second full read that proved it unchanged."""
    import os

    import buildctl.artifact_store.manifest as manifest_mod
    from buildctl.steps import build
    from buildctl.artifact_store.manifest import tree_digests
    from buildctl.engines.errors import ModelSourceError
    from buildctl.engines.fingerprint import detect
    from buildctl.engines.profile import load_profile
    from buildctl.core.times import utc_now

    model = make_tree(tmp_path / "ckpt", {"config.json": b'{"model_type": "llama"}', "model.safetensors": 300_000})
    hashed: list[int] = []
    real = manifest_mod.file_hasher

    def counted(path, *args, **kw):
        h = real(path, *args, **kw)
        if str(path).startswith(str(model)):
            hashed.append(h.size)
        return h

    monkeypatch.setattr(manifest_mod, "file_hasher", counted)
    profile, fp = load_profile(PROFILES / "tiny-llama-cpu.yaml"), detect()
    plan = build.plan_build(ctx, profile, model=str(model), fingerprint=fp)
    run = tmp_path / "run"
    engine = make_tree(run / "engine", {"model.pt2": 7_000, "record.json": b"{}"})
    (run / "build.log").write_text("ok\n")
    built = build.BuiltEngine(plan, run, engine, run / "build.log", 1.0, {"torch": "2.13.0"}, (), utc_now(), utc_now())
    draft = build.manifest_draft(profile, fp)
    facts = build.build_facts(ctx, built, draft)
    size = sum(p.stat().st_size for p in model.rglob("*") if p.is_file())
    assert sum(hashed) == size  # each byte of the checkpoint hashed once, for both digests
    monkeypatch.setattr(manifest_mod, "file_hasher", real)
    assert (facts.model.digest, facts.model.blake3) == tree_digests(model) == (plan.model_digest, plan.model_blake3)
    target = model / "model.safetensors"
    data = bytearray(target.read_bytes())
    data[7] ^= 1
    st = target.stat()
    target.write_bytes(bytes(data))  # same size, and its mtime put back: the ctime still moves
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(ModelSourceError, match=r"changed during the build \(model.safetensors\)"):
        build.build_facts(ctx, built, draft)


VALIDATOR = make_signer()


def _promotable(store, tmp_path, draft, name: str, seed: int, **prov) -> str:
    draft = dataclasses.replace(draft, model_digest="xxh3-128:" + "4" * 32)  # as a build's manifest has
    aid = publish_files(store, tmp_path / name, draft, {"rank0.engine": 20_000}, seed=seed)
    write_attestation(store, aid, draft.compat_key, signer=VALIDATOR)
    write = prov.pop("write", True)
    if write:
        write_build_provenance(store, aid, **prov)
    return staged(store, aid, provenance=write)


def _trusting(ctx, builder):
    return Context(ctx.settings, ctx.store, ctx.auth.but(
        trusted=TrustedKeys({"builder": {builder.key_id: builder.private.public_key()}, "validator": {VALIDATOR.key_id: VALIDATOR.private.public_key()}, "promoter": {}})))


def test_prod_requires_provenance_signed_by_a_builder_with_the_profiles_inputs(ctx, store, tmp_path, draft):
    from buildctl.artifact_store.trust.provenance import TreeRef
    from buildctl.steps.promote import promote

    builder, other = make_signer(), make_signer()
    tctx = _trusting(ctx, builder)
    ok = _promotable(store, tmp_path, draft, "ok", 1, signer=builder)
    assert promote(tctx, ok, "prod").artifact_id == ok

    cases = {
        "none": ({"write": False}, "no build provenance"),
        "unsigned": ({}, "provenance signature: unsigned"),
        "untrusted": ({"signer": other}, "provenance signature: signed by untrusted key"),
        "profile": ({"signer": builder, "profile": TreeRef(digest="xxh3-128:" + "9" * 32, blake3="blake3:" + "1" * 64)},
                    "provenance profile digest " + "9" * 32),
        "model": ({"signer": builder, "model": TreeRef(digest="xxh3-128:" + "8" * 32, blake3="blake3:" + "2" * 64)},
                  "provenance model digest " + "8" * 32),
        "served": ({"signer": builder, "profile_name": "other-profile"}, "built for profile 'other-profile'"),
    }
    for seed, (name, (prov, why)) in enumerate(cases.items(), start=2):
        aid = _promotable(store, tmp_path, draft, name, seed, **prov)
        with pytest.raises(PromotionRefusedError, match="provenance|no build provenance") as exc:
            promote(tctx, aid, "prod")
        assert why in str(exc.value), (name, str(exc.value))
        assert promote(tctx, aid, "staging").artifact_id == aid  # staging takes it: prod only
    # provenance of other bytes, copied beside this manifest, is not this artifact's
    copied = _promotable(store, tmp_path, draft, "copied", 20, write=False)
    store.put_bytes(provenance_key(copied), store.get_bytes(provenance_key(ok)))
    with pytest.raises(PromotionRefusedError, match=f"provenance subject '{ok}'"):
        promote(tctx, copied, "prod")
    # break-glass, recorded; and the policy can be turned off
    assert promote(tctx, copied, "prod", force=True, reason="imported by hand, INC-9").forced
    lax = Context(ctx.settings.model_copy(update={"require_provenance": False}), store, tctx.auth)
    unsigned = _promotable(store, tmp_path, draft, "lax", 21, write=False)
    assert promote(lax, unsigned, "prod").artifact_id == unsigned


@pytest.mark.parametrize("payload", [b"[]", b'{"_type": "https://in-toto.io/Statement/v1", "subject": 7, "predicate": []}',
                                     b'{"_type": "https://in-toto.io/Statement/v1", "subject": [[]], '
                                     b'"predicate": {"buildDefinition": {"resolvedDependencies": [{"name": "profile", "digest": 3}]}}}',
                                     b"not json"])
def test_malformed_provenance_is_refused_with_exit_5_not_a_crash(ctx, store, tmp_path, draft, cli, payload):
    import base64

    aid = _promotable(store, tmp_path, draft, "junk", 1, write=False)
    store.put_bytes(provenance_key(aid), json.dumps({"payloadType": "application/vnd.in-toto+json", "signatures": [],
                                                    "payload": base64.b64encode(payload).decode()}).encode())
    code, _, err = cli("--store", store.uri, "promote", aid, "--channel", "prod")
    assert code == 5 and "provenance" in err, err


def test_prod_checks_the_promoters_profile_not_only_the_manifests(ctx, store, tmp_path, draft):
    """The promoter's profile directory has the profile with other build-affecting settings: an
    artifact built from the old settings is refused for prod, though its provenance matches its manifest."""
    from buildctl.steps.promote import promote

    profiles = tmp_path / "profiles"
    profiles.mkdir()
    text = (PROFILES / "tiny-llama-cpu.yaml").read_text()
    (profiles / "tiny-llama-cpu.yaml").write_text(text.replace("max_batch_size: 32", "max_batch_size: 64"))
    assert (profiles / "tiny-llama-cpu.yaml").read_text() != text
    builder = make_signer()
    tctx = _trusting(ctx, builder)
    moved = Context(ctx.settings.model_copy(update={"profile_dir": profiles}), store, tctx.auth)
    aid = _promotable(store, tmp_path, draft, "old", 1, signer=builder)
    assert promote(tctx, aid, "prod")  # the checkout's profile: its build hash
    aid2 = _promotable(store, tmp_path, draft, "old2", 2, signer=builder)
    with pytest.raises(PromotionRefusedError, match="is not the promoter's profile's build hash"):
        promote(moved, aid2, "prod")


def test_gc_removes_an_artifacts_provenance_with_it(store, tmp_path, draft):
    aid = publish_files(store, tmp_path / "a", draft, {"rank0.engine": 5000})
    write_build_provenance(store, aid)
    assert read_provenance(store, aid) is not None
    gc(store, GcPolicy(keep=0, grace_s=0, delete_window_s=0))
    assert store.stat(provenance_key(aid)) is None and list(store.list("manifests/")) == []


def test_show_provenance_of_an_artifact_without_one_exits_3(store, tmp_path, draft, cli):
    aid = publish_files(store, tmp_path / "a", draft, {"rank0.engine": 5000})
    code, _, err = cli("--store", store.uri, "show", aid, "--provenance")
    assert code == 3 and "has no build provenance" in err, err


@pytest.mark.slow  # a real aoti build of the demo profile (about a minute)
def test_the_demo_builds_provenance_validates_against_the_in_toto_and_slsa_schemas(tiny_build, cli):
    """The provenance of the tiny profile's real build, as `show --provenance` prints it."""
    aid = tiny_build["outcome"].artifact_id
    code, out, err = cli("--store", tiny_build["uri"], "show", aid, "--provenance")
    assert code == 0, err
    stmt = json.loads(out)
    assert schema_problems(stmt) == []
    m = get_manifest(tiny_build["store"], aid)
    deps = {d["name"]: d for d in stmt["predicate"]["buildDefinition"]["resolvedDependencies"]}
    assert deps["model"]["digest"]["xxh3_128"] == hex_of(m.model_digest)
    assert deps["model"]["uri"].startswith("tiny:")
    cmds = stmt["predicate"]["buildDefinition"]["internalParameters"]["commands"]
    assert cmds and "buildctl.engines.aoti.compile" in cmds[0]
    assert stmt["predicate"]["runDetails"]["builder"]["version"]["torch"] == m.tool_versions["torch"]
    assert {s["name"] for s in stmt["subject"][1:]} == {f.path for f in m.files}


def test_only_artifacts_from_before_provenance_are_exempt(ctx, store, tmp_path, draft):
    """A schema 1 artifact's rehash is exempt (test_rehash.py promotes one to prod); a schema 2
    manifest that names another schema 2 artifact as rehashed_from is not."""
    from buildctl.artifact_store.layout import manifest_key
    from buildctl.core.digest import digest_bytes
    from buildctl.steps.promote import promote

    real = _promotable(store, tmp_path, draft, "real", 1, write=False)
    forged = get_manifest(store, real).model_copy(update={"rehashed_from": real})
    body = forged.canonical()
    aid = digest_bytes(body)
    assert store.put_bytes(manifest_key(aid), body)
    write_attestation(store, aid, draft.compat_key, signer=VALIDATOR)
    staged(store, aid, provenance=False)
    with pytest.raises(PromotionRefusedError, match="no build provenance"):
        promote(ctx, aid, "prod")


# --- provenance_refusals, rule by rule (each rule's pass and its refusal) -------------------------


def _stored(store, tmp_path, draft, name: str, seed: int, **changes):
    """An artifact with build provenance (``changes`` on the build facts); its manifest and the
    expected inputs the promoter's profile would give for it."""
    from buildctl.artifact_store.trust.provenance import ExpectedInputs

    draft = dataclasses.replace(draft, model_digest="xxh3-128:" + "4" * 32)
    aid = publish_files(store, tmp_path / name, draft, {"rank0.engine": 2000}, seed=seed)
    write_build_provenance(store, aid, **changes)
    m = get_manifest(store, aid)
    return aid, m, ExpectedInputs(profile_name=m.profile_name, profile_hash=m.profile_hash)


CALIB = {"uri": "s3://calib/set-a", "digest": "xxh3-128:" + "5" * 32, "blake3": "blake3:" + "6" * 64, "size": 8}


def test_the_calibration_set_must_be_the_one_the_profile_names(store, tmp_path, draft):
    from buildctl.artifact_store.trust.provenance import TreeRef, provenance_refusals

    with_calib, m, none_expected = _stored(store, tmp_path, draft, "c", 1, calibration=TreeRef(**CALIB))
    wants = none_expected.model_copy(update={"calibration_uri": CALIB["uri"], "calibration_size": 8})
    assert provenance_refusals(store, with_calib, m, Authority(), wants) == []
    assert provenance_refusals(store, with_calib, m, Authority(), none_expected) == [
        f"provenance names a calibration set ({CALIB['uri']}) the profile does not"]
    for uri, size in (("s3://calib/set-b", 8), (CALIB["uri"], 9)):
        other = wants.model_copy(update={"calibration_uri": uri, "calibration_size": size})
        assert provenance_refusals(store, with_calib, m, Authority(), other) == [
            f"provenance calibration ('{CALIB['uri']}', 8) is not the profile's ({uri}, {size} samples)"]
    without, m2, _ = _stored(store, tmp_path, draft, "n", 2)
    assert provenance_refusals(store, without, m2, Authority(), wants.model_copy(
        update={"profile_hash": m2.profile_hash})) == [
        f"provenance calibration None is not the profile's ({CALIB['uri']}, 8 samples)"]


def _rewrite(store, aid: str, change) -> None:
    """Replace the artifact's provenance with its statement after ``change`` (unsigned)."""
    from buildctl.artifact_store.trust.provenance import envelope_bytes

    stmt = read_provenance(store, aid).statement
    change(stmt)
    store.delete(provenance_key(aid))
    assert store.put_bytes(provenance_key(aid), envelope_bytes(stmt, None))


def test_the_first_subject_must_name_these_manifest_bytes_by_id_and_blake3(store, tmp_path, draft):
    from buildctl.artifact_store.trust.provenance import provenance_refusals

    aid, m, wants = _stored(store, tmp_path, draft, "s", 1)
    assert provenance_refusals(store, aid, m, Authority(), wants) == []
    right = read_provenance(store, aid).statement["subject"][0]
    cases = {
        "renamed": lambda st: st["subject"][0].update(name="xxh3-128:" + "0" * 32),  # the id of other bytes, same BLAKE3
        "other bytes": lambda st: st["subject"][0]["digest"].update(blake3="7" * 64),  # the id, another BLAKE3
        "no subject": lambda st: st.update(subject=[]),
        "not a list": lambda st: st.update(subject={"0": right}),
    }
    for name, change in cases.items():
        _rewrite(store, aid, change)
        (why,) = provenance_refusals(store, aid, m, Authority(), wants)
        assert why.startswith("provenance subject ") and "is not the manifest bytes" in why, (name, why)
        _rewrite(store, aid, lambda st: st.update(subject=[right]))
        assert provenance_refusals(store, aid, m, Authority(), wants) == [], name


def test_a_builder_key_revoked_after_the_build_still_vouches_for_it(store, tmp_path, draft):
    """DSSE's signature is checked with the statement's finishedOn as the signing time: a key
    revoked later keeps its earlier builds, one revoked before the build does not."""
    from datetime import timedelta

    from buildctl.artifact_store.trust.provenance import provenance_refusals
    from buildctl.core.times import parse_utc

    builder = make_signer()
    aid, m, wants = _stored(store, tmp_path, draft, "r", 1)
    store.delete(provenance_key(aid))
    write_build_provenance(store, aid, signer=builder)
    built = parse_utc(read_provenance(store, aid).statement["predicate"]["runDetails"]["metadata"]["finishedOn"])

    def trusting(revoked_at):
        return Authority(trusted=TrustedKeys({"builder": {builder.key_id: builder.private.public_key()}},
                                             revoked={builder.key_id: (revoked_at, "laptop lost")}))

    assert provenance_refusals(store, aid, m, trusting(built + timedelta(hours=1)), wants) == []
    (why,) = provenance_refusals(store, aid, m, trusting(built - timedelta(hours=1)), wants)
    assert "revoked from" in why and "laptop lost" in why


def test_a_stored_envelope_that_is_not_dsse_says_why_in_one_line(store, tmp_path, draft):
    import base64

    from buildctl.artifact_store.errors import CorruptObjectError

    aid, _, _ = _stored(store, tmp_path, draft, "e", 1)
    good = json.loads(store.get_bytes(provenance_key(aid)))
    cases = {
        "not base64": ({**good, "payload": good["payload"][:8] + "*" + good["payload"][8:]}, "Only base64 data is allowed"),
        "not an envelope": ({"payload": good["payload"]}, "2 validation errors for DsseEnvelope"),
    }
    for name, (env, first_line) in cases.items():
        store.delete(provenance_key(aid))
        store.put_bytes(provenance_key(aid), json.dumps(env).encode())
        with pytest.raises(CorruptObjectError) as exc:
            read_provenance(store, aid)
        text = str(exc.value)
        assert "not a DSSE envelope with a JSON payload: " in text and first_line in text and "\n" not in text, (name, text)
    assert base64.b64decode(good["payload"])  # the untouched payload was valid


def test_the_provenance_records_are_frozen(store, tmp_path, draft):
    from pydantic import ValidationError

    from buildctl.artifact_store.trust.provenance import ExpectedInputs, TreeRef

    aid, m, wants = _stored(store, tmp_path, draft, "f", 1)
    prov = read_provenance(store, aid)
    with pytest.raises(dataclasses.FrozenInstanceError):
        prov.payload = b"{}"
    with pytest.raises(ValidationError):
        wants.profile_name = "other"
    with pytest.raises(ValidationError):
        TreeRef(digest="x", blake3="y", extra=1)
    assert isinstance(wants, ExpectedInputs)


def test_manifest_blake3_is_none_for_a_missing_manifest(store):
    from buildctl.artifact_store.trust.binding import manifest_blake3

    assert manifest_blake3(store, "xxh3-128:" + "0" * 32) is None
