"""Who acts on the store, and with which keys: one value, made once per command.

Every store operation that writes a signed record, checks signatures or trusts a recent deep
verify takes an :class:`Authority` instead of six keyword arguments (its policies too: how recent a
deep verify the gates trust, and whether an engine must be bound by BLAKE3). The CLI and the flows make
it once from the settings (:class:`buildctl.steps.context.Context`), so a command reads its key files
once. ``Authority()`` is an anonymous, unsigned actor that enforces no signatures (tests, local
experiments).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from buildctl.artifact_store.trust.signing import SigningKey, TrustedKeys
from buildctl.core.settings import Settings

UNKNOWN_ACTOR = "unknown"
DEFAULT_VERIFY_WINDOW_S: float = Settings.model_fields["verify_window_s"].default  # the one default, in the settings


@dataclass(frozen=True)
class Authority:
    """The actor's identity, keys and the policies that come with them."""

    who: str = UNKNOWN_ACTOR  # recorded in channel history, quarantine and verification records
    signer: SigningKey | None = None  # signs manifests, records and attestations
    trusted: TrustedKeys | None = None  # when set, signatures are enforced (pull, promote, k-of-n)
    ttl_s: float | None = None  # signed channel records expire this long after they are written
    verify_window_s: float = DEFAULT_VERIFY_WINDOW_S  # a deep verify this recent is trusted at the gates
    require_crypto: bool = False  # refuse engines bound by xxh3-128 only (pull, stage, activate)

    def but(self, **changes: object) -> "Authority":
        """A copy with some fields changed."""
        return replace(self, **changes)  # type: ignore[arg-type]
