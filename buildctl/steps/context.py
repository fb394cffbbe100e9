"""The context a command runs in: its settings, its store and its authority, made once.

``Context.from_settings(settings)`` opens the store the settings name and reads the signing key and
the trusted keys once (a bad key layout fails here, before any work). Every step of
:mod:`buildctl.steps.build`, :mod:`buildctl.steps.validate`, :mod:`buildctl.steps.promote`, :mod:`buildctl.steps.healing`, :mod:`buildctl.steps.rollouts` and
:mod:`buildctl.steps.node_agent` takes a ``Context``; store operations take its ``auth``
(:class:`~buildctl.artifact_store.trust.authority.Authority`). The CLI makes one per command, a flow one
per task run (a task may run on another worker).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Callable

from buildctl.artifact_store.trust.authority import Authority
from buildctl.artifact_store.backends.store import Store, open_store
from buildctl.artifact_store.trust.signing import load_signing_key, load_trusted_keys
from buildctl.artifact_store.backends.memo import remember_manifests
from buildctl.core.settings import Settings
from buildctl.engines.fingerprint import Fingerprint, host_fingerprint


Say = Callable[[str], None]
"""How a step reports progress: one line at a time (the CLI prints it, a flow logs it)."""


def quiet(_: str) -> None:
    """The default ``say``: report nothing."""
    return None


def authority_of(settings: Settings) -> Authority:
    """The actor, keys and policies the settings name (key files read here)."""
    return Authority(who=settings.actor, signer=load_signing_key(settings.signing_key),
                     trusted=load_trusted_keys(settings.trusted_keys), ttl_s=settings.record_ttl_s,
                     verify_window_s=settings.verify_window_s, require_crypto=settings.require_crypto)


def open_store_of(settings: Settings, uri: str | None = None) -> Store:
    """The store at ``uri`` (default: the settings' store), with the settings' endpoint."""
    return open_store(uri or settings.store, endpoint_url=settings.endpoint_url)


@dataclass(frozen=True)
class Context:
    """Settings, the store they name, and the authority they give."""

    settings: Settings
    store: Store
    auth: Authority

    @classmethod
    def from_settings(cls, settings: Settings, *, store: Store | None = None, auth: Authority | None = None) -> "Context":
        """A context from ``settings``; ``store`` or ``auth`` given replace what the settings name.
        The store it opens itself keeps the manifests read through it (one read per manifest per
        command or run: :mod:`~buildctl.artifact_store.backends.memo`)."""
        return cls(settings, store if store is not None else remember_manifests(open_store_of(settings)),
                   auth if auth is not None else authority_of(settings))

    @cached_property
    def fingerprint(self) -> Fingerprint:
        """This host's fingerprint, detected once per context (the settings' fingerprint file, or
        the host measured in the runtime that serves)."""
        return host_fingerprint(self.settings)

    def with_fingerprint(self, fingerprint: Fingerprint) -> "Context":
        """The same context for another host: ``fingerprint`` (a node's own, projected for an
        upgrade, or given by a test) instead of this host's."""
        other = replace(self)
        other.__dict__["fingerprint"] = fingerprint  # what cached_property would have stored
        return other

    def with_store(self, store: Store) -> "Context":
        """The same settings and authority on another store."""
        return replace(self, store=store)

    def open_other(self, uri: str) -> Store:
        """Another store (a repair source) with these settings' endpoint and credentials."""
        return open_store_of(self.settings, uri)
