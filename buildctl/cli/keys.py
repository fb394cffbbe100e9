"""Signing keys: generate, revoke."""

from __future__ import annotations


from pathlib import Path
from typing import Optional

import typer

from buildctl.cli._common import JSON_OPT, context, emit_json, out, want_json


key_app = typer.Typer(help="Signing keys.", no_args_is_help=True)

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
        if want_json(ctx, json_out):
            emit_json({"private_key": str(key), "public_key": str(pub), "hint": hint, "role": role,
                       "algorithm": "ecdsa-p256"})
        else:
            out().print(f"export key {hint[:16]} (ECDSA P-256)\nprivate {key} (0600: BUILDCTL_EXPORT_KEY on the promoter's "
                        f"machine only)\npublic  {pub}: give it to whoever verifies exported signatures "
                        "(model_signing verify key --public_key)", highlight=False)
        return
    key, pub, kid = generate(out_dir, name or role)
    where = f"$BUILDCTL_TRUSTED_KEYS/{role}/{pub.name}"
    if want_json(ctx, json_out):
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
    if want_json(ctx, json_out):
        emit_json(rec.model_dump(mode="json"))
    else:
        out().print(f"revoked key {rec.key_id} from {rec.revoked_at} ({rec.reason}); signed by {signer.key_id}. "
                    "Next: re-sign the channels (the resign-channels flow) so nodes move past records it signed",
                    highlight=False)
