"""Store commands: import, ls, show, verify, promote, history, rollback, pull, gc."""

from __future__ import annotations

import time

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from buildctl.cli._common import JSON_OPT, REQUIRE_CRYPTO_OPT, context, emit_json, fail_on_skipped, out, settings, short_id, want_json
from buildctl.cli.progress import byte_progress
from buildctl.artifact_store.layout import node_key

TRUST_OPT = typer.Option(None, "--trust-verify-within", help="Trust a deep verify of the artifact this recent (1h, 30m) "
                         "instead of re-hashing every blob now; recorded in the channel record and shown by history.")

key_app = typer.Typer(help="Signing keys.", no_args_is_help=True)


def _quiet(ctx: typer.Context, json_out: bool) -> bool:
    return want_json(ctx, json_out)


def _tree_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def import_cmd(
    ctx: typer.Context,
    directory: Path = typer.Argument(..., help="An already-built engine directory."),
    profile: Path = typer.Option(..., "--profile", help="The build profile it was built from."),
    fingerprint_file: Optional[Path] = typer.Option(None, "--fingerprint-file", help="The builder's fingerprint JSON (default: this host)."),
    model_digest: Optional[str] = typer.Option(None, "--model-digest", help="The checkpoint's xxh3-128 digest; records a build key."),
    json_out: bool = JSON_OPT,
) -> None:
    """Checksum and publish an engine directory built elsewhere; print its artifact id."""
    from buildctl.engines.fingerprint import host_fingerprint, load_fingerprint
    from buildctl.engines.profile import load_profile
    from buildctl.steps.pipeline import import_engine

    prof = load_profile(profile)
    fp = load_fingerprint(fingerprint_file) if fingerprint_file else host_fingerprint(settings(ctx))
    quiet = _quiet(ctx, json_out)
    total = _tree_size(directory) if directory.is_dir() else None
    with byte_progress("hashing + uploading", total, enabled=not quiet) as on_bytes:
        res = import_engine(context(ctx), directory, prof, fp, model_digest=model_digest, on_bytes=on_bytes)
    if quiet:
        emit_json(res.to_json())
        return
    state = "already published" if res.existed else "published"
    out().print(f"{res.artifact_id}", highlight=False)
    typer.echo(f"{state}: {len(res.manifest.files)} files, {res.manifest.total_size} bytes; "
               f"uploaded {res.uploaded_blobs} blobs ({res.uploaded_bytes} bytes), skipped {res.skipped_blobs}", err=True)


def ls_cmd(
    ctx: typer.Context,
    profile: Optional[str] = typer.Option(None, "--profile", help="Only this profile's artifacts."),
    json_out: bool = JSON_OPT,
) -> None:
    """List artifacts, newest first."""
    from buildctl.artifact_store.quarantine import active_quarantine
    from buildctl.artifact_store.read import list_artifacts

    store = context(ctx, existing=True).store
    skipped: list[tuple[str, str]] = []
    arts = [(a, m, active_quarantine(store, a, skipped)) for a, m in list_artifacts(store, profile)]
    if _quiet(ctx, json_out):
        emit_json([{"artifact_id": a, "profile": m.profile_name, "backend": m.backend, "compat_key": m.compat_key,
                    "created_at": m.created_at, "files": len(m.files), "bytes": m.total_size,
                    "quarantined": q is not None, "quarantine_record": q[0] if q else None} for a, m, q in arts])
    else:
        t = Table()
        for c in ("artifact", "profile", "backend", "compat key", "created", "files", "bytes", "state"):
            t.add_column(c)
        for a, m, q in arts:
            t.add_row(short_id(a), m.profile_name, m.backend, m.compat_key, m.created_at, str(len(m.files)),
                      str(m.total_size), "QUARANTINED" if q else "ok")
        out().print(t)
    fail_on_skipped("ls", skipped)


def show_cmd(ctx: typer.Context, artifact: str = typer.Argument(..., help="Artifact id or unique hex prefix."),
             provenance: bool = typer.Option(False, "--provenance", help="Print the build provenance instead: the in-toto Statement v1 (SLSA Provenance v1) on stdout, its signature on stderr; with --json, the stored DSSE envelope too."),
             json_out: bool = JSON_OPT) -> None:
    """Show an artifact's manifest, attestations, and the channels pointing at it."""
    if provenance:
        _show_provenance(ctx, artifact, json_out)
        return
    from buildctl.artifact_store.trust.attestations import list_attestations
    from buildctl.artifact_store.channels import channels_pointing_at
    from buildctl.artifact_store.quarantine import active_of, quarantine_records
    from buildctl.artifact_store.upkeep.rehash import successors
    from buildctl.artifact_store.read import get_manifest_and_bytes, resolve_artifact
    from buildctl.core.digest import crypto_bytes

    store = context(ctx).store
    aid = resolve_artifact(store, artifact)
    m, body = get_manifest_and_bytes(store, aid)
    succ = successors(store, aid)
    atts = list_attestations(store, aid)
    chans = channels_pointing_at(store, aid)
    qrecs = quarantine_records(store, aid)
    active = active_of(qrecs)
    if _quiet(ctx, json_out):
        emit_json({"artifact_id": aid, "manifest_blake3": crypto_bytes(body), "crypto": m.crypto, "rehashed_as": succ,
                   "manifest": m.model_dump(mode="json"),
                   "attestations": [{"attestation_id": a.attestation_id, **a.attestation.model_dump(mode="json")} for a in atts],
                   "channels": [c.model_dump(mode="json") for c in chans], "quarantined": active is not None,
                   "quarantine": [{"key": k, **r.model_dump(mode="json")} for k, r in qrecs]})
        return
    con = out()
    con.print(f"artifact   {aid}", highlight=False)
    if active is not None:
        key, rec = active
        con.print(f"QUARANTINED {rec.when} by {rec.who}: {rec.reason} ({key})", highlight=False)
        for p in rec.problems:
            con.print(f"  {p}", highlight=False)
    con.print(f"profile    {m.profile_name} ({m.profile_hash})", highlight=False)
    con.print(f"backend    {m.backend}   compat key {m.compat_key}", highlight=False)
    con.print(f"build key  {m.build_key or '-'}   model {m.model_digest or '-'}", highlight=False)
    con.print(f"created    {m.created_at}   build log {m.build_log or '-'}", highlight=False)
    con.print(f"manifest   {crypto_bytes(body)}", highlight=False)
    if m.rehashed_from:
        con.print(f"rehashed   from {m.rehashed_from} (the same files, with BLAKE3)", highlight=False)
    for later in succ:
        con.print(f"rehashed   as {later}", highlight=False)
    con.print("digests    " + ("xxh3-128 + BLAKE3-256 per file (schema 2)" if m.crypto else
                               f"xxh3-128 ONLY (schema {m.schema_version}): refused under --require-crypto; "
                               "`buildctl rehash` upgrades it"), highlight=False)
    t = Table(title="files")
    for c in ("path", "size", "digest", "blake3", "x"):
        t.add_column(c)
    for f in m.files:
        t.add_row(f.path, str(f.size), f.digest, f.blake3 or "-", "x" if f.executable else "")
    con.print(t)
    con.print("attestations: " + (", ".join(f"{a.attestation.created_at} {a.attestation.verdict} ({a.attestation.compat_key})"
                                            for a in atts) or "none"),
              highlight=False)
    con.print("channels:     " + (", ".join(f"{c.channel} #{c.seq}" for c in chans) or "none"), highlight=False)
    con.print("quarantine:   " + (", ".join(f"{r.action} {r.when} ({r.reason})" for _, r in qrecs) or "none"),
              highlight=False)


def _show_provenance(ctx: typer.Context, artifact: str, json_out: bool) -> None:
    import json

    from buildctl.artifact_store.errors import ProvenanceNotFoundError, SignatureError
    from buildctl.artifact_store.trust.provenance import read_provenance, verify_provenance_signature
    from buildctl.artifact_store.read import resolve_artifact

    c = context(ctx)
    aid = resolve_artifact(c.store, artifact)
    prov = read_provenance(c.store, aid)
    if prov is None:
        raise ProvenanceNotFoundError(aid)
    if c.auth.trusted is None:
        signed = ("signed by " + ", ".join(s.keyid for s in prov.envelope.signatures) + " (not checked: no trusted keys)"
                  if prov.envelope.signatures else "unsigned")
    else:
        try:
            signed = f"signed by trusted builder key {verify_provenance_signature(c.store, aid, prov, c.auth.trusted)}"
        except SignatureError as err:
            signed = f"NOT VERIFIED: {err.detail}"
    if _quiet(ctx, json_out):
        emit_json({"artifact_id": aid, "signature": signed, "envelope": prov.envelope.model_dump(mode="json"),
                   "statement": prov.statement})
        return
    typer.echo(json.dumps(prov.statement, indent=2, sort_keys=True))
    typer.echo(f"provenance of {aid}: {signed}", err=True)


def export_signature_cmd(
    ctx: typer.Context,
    artifact: str = typer.Argument(..., help="Artifact id or unique hex prefix."),
    out_path: Path = typer.Option(Path("model.sig"), "--out", help="Where to write the bundle (outside the engine directory: a verifier hashes every file in it)."),
    key: Optional[Path] = typer.Option(None, "--key", help="ECDSA private key to sign with (default: BUILDCTL_EXPORT_KEY)."),
    model_name: Optional[str] = typer.Option(None, "--model-name", help="The subject name in the bundle (default: PROFILE-<12 hex of the id>)."),
    sha256_from: Optional[Path] = typer.Option(None, "--sha256-from", help="An installed copy of the engine (DIR/current, or any directory holding its files): sign SHA-256 digests read from it, each file checked against the manifest's xxh3-128 and BLAKE3 in the same read. For verifiers that re-hash with SHA-256 only, such as model-signing 1.1.1's `verify key` command; the default signs the manifest's BLAKE3 and reads nothing."),
    json_out: bool = JSON_OPT,
) -> None:
    """Write an OpenSSF Model Signing bundle for the artifact's engine directory, from its manifest's
    BLAKE3 digests, signed with the promoter's ECDSA export key: `model_signing verify key` checks an
    installed engine with it."""
    from buildctl.artifact_store.node.export_signature import export_signature, load_export_key

    c = context(ctx)
    private = load_export_key(key or c.settings.export_key)
    aid, bundle = export_signature(c.store, artifact, private, auth=c.auth, model_name=model_name, sha256_dir=sha256_from)
    tmp = out_path.with_name(f".{out_path.name}.tmp")
    tmp.write_bytes(bundle)
    tmp.replace(out_path)
    if _quiet(ctx, json_out):
        emit_json({"artifact_id": aid, "bundle": str(out_path), "format": "openssf-model-signing-v1.0",
                   "hash": "sha256" if sha256_from else "blake3"})
    elif sha256_from:
        out().print(f"{out_path}: model-signing bundle for {aid} (SHA-256 per file, ECDSA); verify an installed engine "
                    f"with: model_signing verify key --signature {out_path} --public_key PROMOTER-EXPORT.pub $(readlink -f DIR/current)",
                    highlight=False)
    else:
        out().print(f"{out_path}: model-signing bundle for {aid} (BLAKE3 per file, ECDSA); verify an installed engine "
                    "with model_signing.verifying.Config().use_elliptic_key_verifier(public_key=...).verify($(readlink -f DIR/current), "
                    f"{out_path!s}) (the 1.1.1 `verify key` command re-hashes with SHA-256 only: export with --sha256-from)",
                    highlight=False)


def verify_cmd(
    ctx: typer.Context,
    artifact: str = typer.Argument(..., help="Artifact id or unique hex prefix."),
    deep: bool = typer.Option(False, "--deep", help="Re-hash every byte from the store (xxh3-128 and, where the manifest has it, BLAKE3-256, in one pass)."),
    require_crypto: bool = REQUIRE_CRYPTO_OPT,
    json_out: bool = JSON_OPT,
) -> None:
    """Check every blob exists with the right size (with --deep: and the right digests; a mismatch
    then quarantines the artifact, where this caller may write)."""
    from buildctl.artifact_store.trust.binding import require_crypto_manifest
    from buildctl.artifact_store.upkeep.integrity import verify_deep_or_quarantine
    from buildctl.artifact_store.read import get_manifest, resolve_artifact, verify

    c = context(ctx, require_crypto=require_crypto)
    store = c.store
    aid = resolve_artifact(store, artifact)
    manifest = get_manifest(store, aid)
    if c.settings.require_crypto:
        require_crypto_manifest(aid, manifest)
    total = manifest.total_size if deep else None
    with byte_progress("re-hashing", total, enabled=deep and not _quiet(ctx, json_out)) as on_bytes:
        if deep:
            m, _ = verify_deep_or_quarantine(store, aid, detector="verify --deep", auth=c.auth, on_bytes=on_bytes)
        else:
            m = verify(store, aid, on_bytes=on_bytes)
    if _quiet(ctx, json_out):
        emit_json({"artifact_id": aid, "ok": True, "deep": deep, "files": len(m.files), "bytes": m.total_size,
                   "crypto": m.crypto})
    else:
        how = (" re-hashed (BLAKE3-256, each byte once)" if m.crypto else
               " re-hashed (xxh3-128 only: schema 1 manifest)") if deep else ""
        out().print(f"ok {aid}: {len(m.files)} files, {m.total_size} bytes{how}", highlight=False)


def rehash_cmd(
    ctx: typer.Context,
    artifact: str = typer.Argument(..., help="Artifact id or unique hex prefix (a schema 1 artifact: xxh3-128 only)."),
    json_out: bool = JSON_OPT,
) -> None:
    """Publish a BLAKE3 (schema 2) manifest for an artifact published before BLAKE3: every blob
    re-read from the store, xxh3-128 checked and BLAKE3-256 computed in one pass, the new manifest
    signed with BUILDCTL_SIGNING_KEY and linked to the old one. Promote the new id as usual; the
    old one's attestation counts for it (the same files)."""
    from buildctl.artifact_store.upkeep.rehash import rehash
    from buildctl.artifact_store.read import get_manifest, resolve_artifact

    c = context(ctx)
    aid = resolve_artifact(c.store, artifact)
    quiet = _quiet(ctx, json_out)
    with byte_progress("re-hashing", get_manifest(c.store, aid).total_size, enabled=not quiet) as on_bytes:
        res = rehash(c.store, aid, auth=c.auth, on_bytes=on_bytes)
    if quiet:
        emit_json(res.to_json())
    elif res.new == res.old:
        out().print(f"{aid} already has BLAKE3 digests (schema 2): nothing to do", highlight=False)
    else:
        signed = "signed" if c.auth.signer is not None else "UNSIGNED (no BUILDCTL_SIGNING_KEY)"
        out().print(f"rehashed {aid} as {res.new}: {res.files} files, {res.bytes} bytes, {signed}"
                    f"{' (existed)' if res.existed else ''}; promote {short_id(res.new)} to serve it", highlight=False)


def _record_json(rec) -> dict:
    return rec.body()


def promote_cmd(
    ctx: typer.Context,
    artifact: str = typer.Argument(..., help="Artifact id or unique hex prefix."),
    channel: str = typer.Option(..., "--channel", help="Channel name, e.g. staging or prod."),
    force: bool = typer.Option(False, "--force", help="Break glass: skip the gates (needs --reason; recorded)."),
    reason: Optional[str] = typer.Option(None, "--reason", help="Why; recorded in the history."),
    rollout: Optional[str] = typer.Option(None, "--rollout", help="Roll out in waves: cumulative percentages of nodes, e.g. 1,10,50,100 (default: every node at once)."),
    bake: Optional[str] = typer.Option(None, "--bake", help="With --rollout: how long each wave runs before the next (30m, 2h, 0; default 30m)."),
    max_failures: Optional[str] = typer.Option(None, "--max-failures", help="With --rollout: failed nodes each wave tolerates, a count or a share, one for all or one per wave (e.g. 0,1%,2%,2%; default 0)."),
    trust_verify_within: Optional[str] = TRUST_OPT,
    new_channel: bool = typer.Option(False, "--new-channel", help="Create a channel outside BUILDCTL_CHANNELS (default staging, prod) that the store does not have yet; without it such a name is refused as a typo."),
    json_out: bool = JSON_OPT,
) -> None:
    """Move a channel to an artifact that verifies and passed validation (with --rollout: in waves).
    Every blob is re-hashed first unless --trust-verify-within allows a recent deep verify. prod
    takes only an artifact that was on staging first; --force --reason overrides that and the
    attestation gate, and is recorded."""
    from buildctl.steps.pipeline import promote_artifact
    from buildctl.artifact_store.errors import StoreArgumentError
    from buildctl.artifact_store.fleet.waves import RolloutPlan, parse_waves
    from buildctl.core.times import parse_duration

    plan = None
    if rollout is not None:
        plan = RolloutPlan(waves=parse_waves(rollout, max_failures), bake_s=parse_duration(bake or "30m"))
    elif max_failures is not None or bake is not None:
        raise StoreArgumentError("--bake and --max-failures need --rollout")
    from buildctl.artifact_store.channels import pending_promotion

    c = context(ctx)
    rec = promote_artifact(c, artifact, channel, force=force, reason=reason, rollout=plan,
                           trust_verify_within_s=parse_duration(trust_verify_within) if trust_verify_within else 0.0,
                           new_channel=new_channel)
    store, trusted = c.store, c.auth.trusted
    pend = pending_promotion(store, rec.profile, rec.channel, rec.compat_key)
    if pend is not None and (pend.seq, pend.artifact_id) == (rec.seq, rec.artifact_id):  # waiting for more signatures
        have, need = len(rec.signers(trusted)) if trusted else 1, trusted.threshold(channel) if trusted else 1
        if _quiet(ctx, json_out):
            emit_json({**_record_json(rec), "pending": True, "signatures": have, "required": need,
                       "missing": need - have})
        else:
            out().print(f"{rec.channel} #{rec.seq}: {rec.artifact_id} is pending: {have} of {need} promoter "
                        f"signatures, {need - have} still missing; each other promoter runs the same command "
                        "to add theirs", highlight=False)
        return
    told = None
    if rec.rollout is not None:
        # Tell the rollout-channel deployment at once (it turns its 5-minute schedule on); the one
        # place besides pull and node report that reaches the flows package, lazily.
        from buildctl.flows.events import emit_rollout_started

        told = emit_rollout_started(rec.profile, rec.channel, rec.compat_key, rec.artifact_id, rec.seq)
    if _quiet(ctx, json_out):
        emit_json({**_record_json(rec), **({"rollout_event": told} if rec.rollout is not None else {})})
    else:
        out().print(f"{rec.channel} #{rec.seq}: {rec.profile} [{rec.compat_key}] -> {rec.artifact_id}"
                    f" (was {rec.previous or 'none'}){' FORCED' if rec.forced else ''}", highlight=False)
        if rec.rollout is not None:
            waves = ", ".join(f"{w.percent:g}% (max failures {w.max_failures})" for w in rec.rollout.waves)
            out().print(f"rollout started: waves {waves}; bake {rec.rollout.bake_s:g}s. Nodes outside the wave keep "
                        f"{rec.rollout.base}. Follow it: buildctl rollout status --profile {rec.profile} "
                        f"--channel {rec.channel}", highlight=False)
            if told is None:
                out().print("no Prefect API to tell (PREFECT_API_URL): the rollout-channel deployment's hourly run "
                            "picks it up", highlight=False)


def _verified(r) -> str:
    """What a record's gate relied on: a re-hash, a trusted earlier deep verify, or none (a rollout step)."""
    if r.verified_at is None:
        return ""
    if not r.verify_window_s:
        return f"re-hashed at the gate ({r.verified_at})"
    from buildctl.core.times import format_duration

    return f"trusted a verify within {format_duration(r.verify_window_s)} ({r.verified_at})"


def _history_table(records, problems: dict | None = None) -> Table:
    problems = problems or {}
    t = Table()
    for c in ("seq", "compat key", "action", "artifact", "previous", "who", "when", "bytes checked", "reason"):
        t.add_column(c)
    for r in records:
        bad = problems.get((r.compat_key, r.seq))
        t.add_row(str(r.seq), r.compat_key, (f"FORGED? {bad}: " if bad else "") + r.action
                  + (" (forced)" if r.forced else ""), short_id(r.artifact_id),
                  short_id(r.previous), r.who, r.when, _verified(r), r.reason or "")
    return t


def history_cmd(
    ctx: typer.Context,
    profile: str = typer.Option(..., "--profile", help="Profile name."),
    channel: str = typer.Option(..., "--channel", help="Channel name."),
    compat_key: Optional[str] = typer.Option(None, "--compat-key", help="Only this compat key."),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Only the newest N records of each compat key."),
    since_seq: int = typer.Option(0, "--since-seq", min=0, help="Only records after this sequence number."),
    json_out: bool = JSON_OPT,
) -> None:
    """The channel's promotion history, oldest first; only the records shown are read. A record no
    reader may act on (ahead of the ref, unsigned on a signed channel, not linked to the record
    after it) is marked FORGED? with why (`problem` in --json)."""
    from buildctl.artifact_store.errors import ChannelNotFoundError
    from buildctl.artifact_store.channels import history, record_problems

    skipped: list[tuple[str, str]] = []
    c = context(ctx)
    recs = history(c.store, profile, channel, compat_key, skipped, since_seq=since_seq, limit=limit)
    if not recs and not skipped and not since_seq:  # after --since-seq, nothing newer is an empty answer
        from buildctl.artifact_store.node.pull import unknown_name

        raise ChannelNotFoundError(profile, channel, [compat_key or "<any>"],
                                   unknown_name(context(ctx).store, profile, channel))
    problems = record_problems(c.store, recs, c.auth.trusted)
    if _quiet(ctx, json_out):
        emit_json([{**_record_json(r), **({"problem": problems[(r.compat_key, r.seq)]}
                                          if (r.compat_key, r.seq) in problems else {})} for r in recs])
    else:
        out().print(_history_table(recs, problems))
    fail_on_skipped("history", skipped)


def rollback_cmd(
    ctx: typer.Context,
    profile: str = typer.Option(..., "--profile", help="Profile name."),
    channel: str = typer.Option(..., "--channel", help="Channel name."),
    to: Optional[str] = typer.Option(None, "--to", help="Artifact to go back to (default: the one before the current)."),
    compat_key: Optional[str] = typer.Option(None, "--compat-key", help="Which compat key's ref, when there are several."),
    reason: Optional[str] = typer.Option(None, "--reason", help="Why; recorded in the history."),
    trust_verify_within: Optional[str] = TRUST_OPT,
    json_out: bool = JSON_OPT,
) -> None:
    """Point the channel back at an earlier artifact (recorded as a new promotion), after
    re-hashing every blob of it unless --trust-verify-within allows a recent deep verify."""
    from buildctl.artifact_store.promotion import rollback
    from buildctl.core.times import parse_duration

    c = context(ctx)
    rec = rollback(c.store, profile, channel, auth=c.auth, to=to, compat_key=compat_key, reason=reason,
                   trust_verify_within_s=parse_duration(trust_verify_within) if trust_verify_within else 0.0)
    if _quiet(ctx, json_out):
        emit_json(_record_json(rec))
    else:
        out().print(f"{rec.channel} #{rec.seq}: rolled back to {rec.artifact_id} (was {rec.previous})", highlight=False)


def pull_cmd(
    ctx: typer.Context,
    profile: str = typer.Option(..., "--profile", help="Profile name."),
    channel: str = typer.Option(..., "--channel", help="Channel name."),
    dest: Path = typer.Option(..., "--dest", help="Install directory; DIR/current points at the engine."),
    keep: int = typer.Option(2, "--keep", min=2, max=10_000, help="Installed versions to keep (current and previous at least)."),
    skip_preflight: bool = typer.Option(False, "--skip-preflight", help="Install after byte verification only, without a test load (e.g. staging a cache on a host without the GPU)."),
    node_id: Optional[str] = typer.Option(None, "--node-id", help="This node's id: picks its side of a rollout (by wave bucket); its smoke-check verdict and any refused pull (exit 4 or 5) go into its inventory record, with a buildctl.node.* event."),
    health_cmd: Optional[str] = typer.Option(None, "--health-cmd", help="Smoke check to run after installing, via sh -c with the engine dir as $1 and the artifact id as $2 (default: load the engine and generate a few tokens)."),
    health_check: Optional[bool] = typer.Option(None, "--health-check/--no-health-check", help="Smoke-check a newly installed engine and switch back to the previous one if it fails (default: on with --node-id or --health-cmd)."),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="Install an artifact again although it failed its smoke check here before."),
    min_seq: int = typer.Option(0, "--min-seq", min=0, max=2**63 - 1, help="Refuse a channel record older than this sequence (exit 4); provisioning pins it so a new node cannot be handed a replayed record."),
    require_covered: bool = typer.Option(False, "--require-covered", help="Refuse (exit 5), before downloading, an engine not validated on this host's soft values (driver, GPU model, CUDA minor; see fingerprint --json)."),
    for_upgrade: Optional[Path] = typer.Option(None, "--for-upgrade", help="TARGET.yaml: pull the engine this node needs after that upgrade (its fingerprint with the target's fields); needs --stage-only."),
    stage_only: bool = typer.Option(False, "--stage-only", help="Download and deep-verify into DIR/versions/ without touching DIR/current; `buildctl node activate` swaps it in later, offline."),
    require_crypto: bool = REQUIRE_CRYPTO_OPT,
    json_out: bool = JSON_OPT,
) -> None:
    """Install the channel's engine for this node: verify, preflight, swap atomically, smoke-check.
    With --for-upgrade TARGET --stage-only: stage the engine for after an upgrade instead."""
    from buildctl.engines.fingerprint import host_fingerprint
    from buildctl.steps.coverage import coverage
    from buildctl.core.errors import BadInputError, GateRefusedError, IntegrityError
    from buildctl.steps import node_agent
    from buildctl.steps.pipeline import channel_target, report_pull_failure

    if for_upgrade is not None and not stage_only:
        raise BadInputError("--for-upgrade needs --stage-only: the engine for the upgraded host cannot load before "
                            "the upgrade; stage it now and run `buildctl node activate` after the upgrade")
    c = context(ctx, require_crypto=require_crypto)  # a bad trusted-key layout is reported before anything else
    st = c.settings
    fp = host_fingerprint(st)
    quiet = _quiet(ctx, json_out)
    if stage_only:
        _stage(c, profile, channel, dest, for_upgrade, node_id, fp, min_seq, quiet)
        return
    rec, manifest = channel_target(c, profile, channel, fp, node_id=node_id)
    checks = health_check if health_check is not None else bool(node_id or health_cmd)

    def on_health(state) -> None:
        if not node_id:
            return
        # The one place besides node report that reaches the flows package, lazily.
        from buildctl.flows.events import emit_engine_health

        emit_engine_health(node_id, state.model_dump(mode="json"))
        if state.status != "installed" and not quiet:
            out().print(f"smoke check: {state.status}" + (f" ({state.detail})" if state.detail else ""), highlight=False)

    t0 = time.monotonic()
    try:
        with byte_progress("downloading + verifying", manifest.total_size, enabled=not quiet) as on_bytes:
            got = node_agent.pull(c, profile, channel, dest, node_id=node_id, fingerprint=fp, health_cmd=health_cmd,
                            health_check=checks, skip_preflight=skip_preflight, retry_failed=retry_failed, keep=keep,
                            min_seq=min_seq, on_bytes=on_bytes, on_health=on_health, target=(rec, manifest),
                            require_covered=require_covered)
    except (IntegrityError, GateRefusedError) as err:
        if node_id:
            failure = report_pull_failure(c, node_id, fp, rec, err, artifact_id=rec.artifact_for(node_id))
            if failure is not None:
                from buildctl.flows.events import emit_pull_failed

                event_id = emit_pull_failed(node_id, failure.model_dump(mode="json"))
                typer.echo(f"recorded in {node_key(node_id)}"
                           + (f"; emitted buildctl.node.pull-failed ({event_id})" if event_id else ""), err=True)
        raise
    res, rec = got.result, got.record
    if quiet:
        emit_json({"artifact_id": res.artifact_id, "installed": res.installed, "path": str(res.path),
                   "preflight": not skip_preflight,
                   "current": str(Path(dest) / "current"), "previous": res.previous, "seq": rec.seq,
                   "bytes": res.bytes, "health": got.state.status if got.state else None,
                   "health_recorded": got.reported if got.state and node_id else None,
                   "rollout": rec.rollout.state if rec.rollout else None,
                   "coverage": coverage(c.store, res.artifact_id, manifest, fp).to_json()})
    elif res.installed:
        secs = max(time.monotonic() - t0, 1e-6)
        out().print(f"installed {res.artifact_id} ({channel} #{rec.seq}) at {Path(dest) / 'current'}; "
                    f"previous: {res.previous or 'none'}; {len(manifest.files)} files, {res.bytes / 1e6:.1f} MB "
                    f"in {secs:.1f} s ({res.bytes / 1e6 / secs:.1f} MB/s, verified)", highlight=False)
    else:
        out().print(f"already installed: {res.artifact_id} ({channel} #{rec.seq}) is current in {dest}", highlight=False)
    if got.state is not None and node_id and not got.reported:
        typer.echo(f"warning: could not record the smoke-check verdict in {node_key(node_id)}", err=True)


def _stage(c, profile: str, channel: str, dest: Path, for_upgrade: Path | None, node_id: str | None, fp,
           min_seq: int, quiet: bool) -> None:
    from buildctl.steps import node_agent
    from buildctl.engines.fingerprint import load_target
    from buildctl.steps.pipeline import channel_target

    target = load_target(for_upgrade) if for_upgrade is not None else None
    projected = target.apply(fp) if target is not None else fp
    rec, manifest = channel_target(c, profile, channel, projected, node_id=node_id)
    with byte_progress("staging: downloading + verifying", manifest.total_size, enabled=not quiet) as on_bytes:
        got = node_agent.stage(c, profile, channel, dest, target, node_id=node_id, fingerprint=fp, min_seq=min_seq,
                               on_bytes=on_bytes, target_record=rec)
    if quiet:
        emit_json(got.to_json())
        return
    out().print(f"staged {got.entry.artifact_id} ({channel} #{got.entry.record.seq}, {got.entry.compat_key}) in "
                f"{Path(dest) / 'versions'}; current untouched" + ("" if got.downloaded else " (already on disk, re-hashed)"),
                highlight=False)
    if not got.coverage.covered:
        out().print(f"note: {got.coverage.describe()}", highlight=False)
    out().print(f"after the upgrade: buildctl node activate --profile {profile} --channel {channel} --dest {dest}",
                highlight=False)


def gc_cmd(
    ctx: typer.Context,
    keep: int = typer.Option(3, "--keep", min=0, max=10_000_000, help="Newest artifacts to keep per (profile, compat key), referenced or not."),
    keep_history: int = typer.Option(5, "--keep-history", min=0, max=10_000_000, help="Keep every artifact the last N records of each channel's history name (rollback targets)."),
    grace: Optional[str] = typer.Option(None, "--grace", help="Never remove manifests created, or blobs a publish touched, within this (default BUILDCTL_GC_GRACE_S, 24h)."),
    quarantine_retention: str = typer.Option("30d", "--quarantine-retention", help="Keep quarantined artifacts this long after their last quarantine record."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only say what would be removed and what is kept, with reasons."),
    compact_history: bool = typer.Option(True, "--compact-history/--no-compact-history", help="Also remove re-sign records older than each channel ref's last --keep-history records (they repeat the record before them; decisions are never compacted)."),
    json_out: bool = JSON_OPT,
) -> None:
    """Remove artifacts nothing protects: not a channel's, not in its recent history, not on a node,
    not quarantined recently, not new, not among the newest N per (profile, compat key); and compact
    channel history of superseded re-sign records."""
    from buildctl.steps import fleet
    from buildctl.core.times import parse_duration

    c = context(ctx, existing=True)
    policy = fleet.gc_policy(c.settings, keep=keep, keep_history=keep_history,
                             grace_s=parse_duration(grace) if grace is not None else None,
                             quarantine_retention_s=parse_duration(quarantine_retention),
                             compact_history=compact_history)
    res = fleet.gc(c, policy, dry_run=dry_run)
    if _quiet(ctx, json_out):
        emit_json(res.to_json())
    else:
        _print_gc(ctx, res, dry_run)
    fail_on_skipped("gc", res.skipped)


def _print_gc(ctx: typer.Context, res, dry_run: bool) -> None:
    verb = "would remove" if dry_run else "removed"
    gone = [d for d in res.decisions if not d.protected_by]
    out().print(f"{verb} {len(res.removed_artifacts)} artifacts and {res.removed_blobs} blobs ({res.freed_bytes} bytes); "
                f"kept {res.kept} artifacts", highlight=False)
    for d in gone:
        out().print(f"  {verb} {d.artifact_id} ({d.profile} [{short_id(d.compat_key)}], {d.created_at})"
                    + (f": NOT REMOVED: {d.error}" if d.error else "") + (f"\n      {d.why_removable}" if dry_run else ""),
                    highlight=False)
    if dry_run or ctx.obj.verbose:
        for d in res.decisions:
            if d.protected_by:
                out().print(f"  keep {d.artifact_id} ({d.profile} [{short_id(d.compat_key)}]): "
                            + "; ".join(d.protected_by), highlight=False)
    if dry_run and res.history_examined:
        out().print(f"would examine {res.history_examined} channel history record(s) older than each ref's last "
                    "--keep-history records and remove the re-sign records among them (a dry run does not read them)",
                    highlight=False)
    elif res.compacted_history:
        out().print(f"compacted {len(res.compacted_history)} superseded re-sign record(s) from channel history "
                    f"(examined {res.history_examined})", highlight=False)
    if res.kept_blobs:
        out().print(f"kept {res.kept_blobs} unreferenced blobs a publish touched within the grace period", highlight=False)
    for key, why in res.not_removed:
        typer.echo(f"could not remove {key}: {why}", err=True)
    for artifact, why in res.unreadable:
        typer.echo(f"warning: the manifest of {artifact} does not verify ({why}): it and every blob it names are "
                   f"kept; `buildctl heal {artifact}` repairs it", err=True)
    for artifact in res.index_missing:
        typer.echo(f"warning: a node record holds {artifact} and the node index has no held marker for it: kept; "
                   "`buildctl scrub` writes the missing markers back", err=True)
    if res.stopped_early:
        typer.echo(res.stopped_early, err=True)


@key_app.command("generate")
def key_generate_cmd(
    ctx: typer.Context,
    out_dir: Path = typer.Option(..., "--out", help="Directory for NAME.key (mode 0600) and NAME.pub."),
    role: Optional[str] = typer.Option(None, "--role", help="builder (signs manifests), validator (attestations) or promoter (channel records)."),
    name: Optional[str] = typer.Option(None, "--name", help="File name stem (default: the role)."),
    ecdsa_p256: bool = typer.Option(False, "--ecdsa-p256", help="Promoter only: an ECDSA P-256 key for export-signature (BUILDCTL_EXPORT_KEY); OpenSSF model-signing verifies EC keys only. It signs nothing in buildctl's own trust chain."),
    json_out: bool = JSON_OPT,
) -> None:
    """Make an Ed25519 key pair for one role: builder, validator or promoter (with --ecdsa-p256, the
    promoter's export key)."""
    from buildctl.artifact_store.errors import StoreArgumentError
    from buildctl.artifact_store.trust.signing import ROLES, generate

    if role is None or role not in ROLES:
        raise StoreArgumentError(f"--role {role or '(missing)'}: one of {', '.join(ROLES)} (each signs one kind of record, "
                                 "and trust is by role)")
    if ecdsa_p256:
        from buildctl.artifact_store.node.export_signature import generate_export_key

        if role != "promoter":
            raise StoreArgumentError(f"--ecdsa-p256 with --role {role}: export keys are the promoter's (export-signature)")
        key, pub, hint = generate_export_key(out_dir, name or "promoter-export")
        if _quiet(ctx, json_out):
            emit_json({"private_key": str(key), "public_key": str(pub), "hint": hint, "role": role,
                       "algorithm": "ecdsa-p256"})
        else:
            out().print(f"export key {hint[:16]} (ECDSA P-256)\nprivate {key} (0600: BUILDCTL_EXPORT_KEY on the promoter's "
                        f"machine only)\npublic  {pub}: give it to whoever verifies exported signatures "
                        "(model_signing verify key --public_key)", highlight=False)
        return
    key, pub, kid = generate(out_dir, name or role)
    where = f"$BUILDCTL_TRUSTED_KEYS/{role}/{pub.name}"
    if _quiet(ctx, json_out):
        emit_json({"private_key": str(key), "public_key": str(pub), "key_id": kid, "role": role, "trust_as": where})
    else:
        out().print(f"key id {kid} ({role})\nprivate {key} (0600: keep it on the {role}'s machine only)\n"
                    f"public  {pub}: copy it to {where} wherever {role} signatures are checked (nodes, CI)",
                    highlight=False)


@key_app.command("revoke")
def key_revoke_cmd(
    ctx: typer.Context,
    key_id: str = typer.Argument(..., help="The key id to revoke (16 hex, as key generate printed it)."),
    reason: str = typer.Option(..., "--reason", help="Why; recorded with the revocation."),
    revoked_from: Optional[str] = typer.Option(None, "--from", help="UTC ISO-8601 time from which its signatures stop counting (default: now)."),
    json_out: bool = JSON_OPT,
) -> None:
    """Revoke a key: a create-only record signed with BUILDCTL_SIGNING_KEY (a promoter key);
    signatures by the key on records made from then on are refused by pull and promote."""
    import re

    from buildctl.artifact_store.errors import StoreArgumentError
    from buildctl.artifact_store.trust.revocation import revoke

    c = context(ctx)
    signer = c.auth.signer
    if signer is None:
        raise StoreArgumentError("key revoke needs a promoter signing key (BUILDCTL_SIGNING_KEY)")
    if not re.fullmatch(r"[0-9a-f]{16}", key_id):
        raise StoreArgumentError(f"key id {key_id!r}: 16 lowercase hex digits")
    if revoked_from is not None:
        from buildctl.core.times import parse_utc

        try:
            parse_utc(revoked_from)
        except ValueError:
            raise StoreArgumentError(f"--from {revoked_from!r}: a UTC ISO-8601 time") from None
    rec = revoke(c.store, key_id, reason, auth=c.auth, revoked_at=revoked_from)
    if _quiet(ctx, json_out):
        emit_json(rec.model_dump(mode="json"))
    else:
        out().print(f"revoked key {rec.key_id} from {rec.revoked_at} ({rec.reason}); signed by {signer.key_id}. "
                    "Next: re-sign the channels (the resign-channels flow) so nodes move past records it signed",
                    highlight=False)


index_app = typer.Typer(help="The node index (inventory/index/): markers that let fleet-wide commands LIST "
                             "instead of reading every node record.", no_args_is_help=True)


def _index_report(ctx: typer.Context, json_out: bool, repair: bool) -> None:
    from buildctl.artifact_store.errors import IndexMismatchError
    from buildctl.steps.node_index import rebuild

    report = rebuild(context(ctx, existing=True).store, repair=repair)
    if _quiet(ctx, json_out):
        emit_json(report.to_json())
    else:
        done = "written" if repair else "missing"
        out().print(f"{report.nodes} node record(s), {report.markers} marker(s): {len(report.missing)} {done}, "
                    f"{len(report.stale)} stale{' (deleted)' if repair else ''}; "
                    f"index {'in use' if report.ready else 'not built yet (readers read the records)'}")
        for key in (report.missing + report.stale)[:20]:
            out().print(f"  {key}")
    fail_on_skipped(f"index {'rebuild' if repair else 'check'}", report.skipped)
    if not repair and not report.ok:
        raise IndexMismatchError(report.missing, report.stale)


@index_app.command("rebuild")
def index_rebuild_cmd(ctx: typer.Context, json_out: bool = JSON_OPT) -> None:
    """Derive every node-index marker from the node records: write the missing ones, delete the
    stale ones, and mark the index built (the migration of a store written before it)."""
    _index_report(ctx, json_out, repair=True)


@index_app.command("check")
def index_check_cmd(ctx: typer.Context, json_out: bool = JSON_OPT) -> None:
    """Compare the node index with the node records; exit 4 on a missing or stale marker."""
    _index_report(ctx, json_out, repair=False)
