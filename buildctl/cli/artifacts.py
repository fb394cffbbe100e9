"""Artifact commands: import, ls, show, verify, rehash, export-signature, gc."""

from __future__ import annotations


from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from buildctl.cli._common import JSON_OPT, REQUIRE_CRYPTO_OPT, context, emit_json, fail_on_skipped, out, settings, short_id, want_json
from buildctl.cli.progress import byte_progress


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
    from buildctl.steps.build import import_engine

    prof = load_profile(profile)
    fp = load_fingerprint(fingerprint_file) if fingerprint_file else host_fingerprint(settings(ctx))
    quiet = want_json(ctx, json_out)
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
    if want_json(ctx, json_out):
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
    if want_json(ctx, json_out):
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
    if want_json(ctx, json_out):
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
    if want_json(ctx, json_out):
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
    with byte_progress("re-hashing", total, enabled=deep and not want_json(ctx, json_out)) as on_bytes:
        if deep:
            m, _ = verify_deep_or_quarantine(store, aid, detector="verify --deep", auth=c.auth, on_bytes=on_bytes)
        else:
            m = verify(store, aid, on_bytes=on_bytes)
    if want_json(ctx, json_out):
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
    quiet = want_json(ctx, json_out)
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
    if want_json(ctx, json_out):
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
