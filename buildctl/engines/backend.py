"""The engine backend interface: build for this host, load for generation, preflight on a node.

A backend has three operations:

* ``build(profile, model_dir, out_dir, fingerprint, log_path, *, model_digest) -> BuildResult``,
  always in an isolated subprocess with the profile's timeout;
* ``load(engine_dir) -> Runner``;
* ``preflight(engine_dir)``: load or deserialize the engine on this host without serving it;
* ``unmet_requirements(profile, fingerprint)``: why this host cannot build a profile, checked
  before anything costly;

and what it takes from a fingerprint or a directory: ``tool_version``, its ``compat`` fields
(hard and soft) and ``floors``, and ``recognises``. Backends are constructed with the :class:`~buildctl.core.settings.Settings`.

A :class:`Runner` generates greedily from token-id prompts. The validators use the same
interface for the vLLM reference, so comparison code does not care which side is which.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Iterator, Protocol, runtime_checkable

from buildctl.engines.compat import CompatField, Floor
from buildctl.engines.fingerprint import Fingerprint
from buildctl.engines.profile import BuildProfile
from buildctl.core.settings import Settings


@dataclass
class Generation:
    """One prompt's greedy output: token ids and, per step, the top-k ``{token: logprob}``."""

    token_ids: list[int]
    top_logprobs: list[dict[int, float]] = field(default_factory=list)


@dataclass(frozen=True)
class TokenEvent:
    """A streamed event: request ``index`` was submitted (``token_id`` None) or produced a token,
    at ``time`` (``time.perf_counter()``, taken where the runner saw it happen)."""

    index: int
    token_id: int | None
    time: float


@dataclass
class BuildResult:
    """What a build produced."""

    engine_dir: Path
    files: list[str]
    log_path: Path
    wall_s: float
    tool_versions: dict[str, str | None]
    commands: tuple[tuple[str, ...], ...] = ()  # the command lines the build ran, in order (build provenance)


@runtime_checkable
class Runner(Protocol):
    """Greedy generation over token ids."""

    name: str

    def generate(self, prompts: list[list[int]], max_tokens: int, top_logprobs: int) -> list[Generation]:
        """Greedy outputs for every prompt (batched where the backend can)."""
        ...

    def stream(self, prompts: list[list[int]], max_tokens: int, concurrency: int) -> Iterator[TokenEvent]:
        """Serve ``prompts`` with at most ``concurrency`` requests in flight, yielding a submission
        event per request and a token event per generated token as they happen (TTFT, TPOT, ITL)."""
        ...

    def close(self) -> None:
        ...


@runtime_checkable
class EngineBackend(Protocol):
    """One engine backend. Each backend module declares everything about its engines in its class:
    the tool version and compat-key fields it takes from a fingerprint, how to recognise its engine
    directory, and build, load and preflight. :mod:`buildctl.engines.registry` lists the classes."""

    name: ClassVar[str]

    def __init__(self, settings: Settings) -> None:
        ...

    @staticmethod
    def tool_version(fingerprint: Fingerprint) -> str | None:
        """The version of the tool that builds this backend's engines on a host (in the build key)."""
        ...

    @staticmethod
    def gpus_needed(profile: BuildProfile) -> int:
        """How many GPUs a build of ``profile`` takes (a Kubernetes job requests them)."""
        ...

    compat: ClassVar[tuple[CompatField, ...]]
    """The fingerprint fields its engines depend on, each hard (rebuild) or soft (re-check), with
    its upstream source (:mod:`buildctl.engines.compat`); the compat key hashes the hard ones."""

    floors: ClassVar[tuple[Floor, ...]]
    """Requirements a host must meet to run its engines (not part of the key)."""

    engine_format: ClassVar[int]
    """The engine directory's format version. A format other than 1 enters the build key
    (:mod:`buildctl.engines.buildkey`), so an engine of a new format is never a cache hit for an old one."""

    @staticmethod
    def legacy_compat_fields(fingerprint: Fingerprint) -> dict[str, Any]:
        """The fields of this backend's schema-1 compat keys, so that old channels keep resolving."""
        ...

    @staticmethod
    def recognises(engine_dir: Path) -> bool:
        """Whether ``engine_dir`` holds an engine of this backend."""
        ...

    def unmet_requirements(self, profile: BuildProfile, fingerprint: Fingerprint) -> list[str]:
        """Every reason this host cannot build ``profile`` (empty: it can); cheap, run before any
        download or build."""
        ...

    def build(self, profile: BuildProfile, model_dir: Path, out_dir: Path, fingerprint: Fingerprint,
              log_path: Path, *, model_digest: str | None = None) -> BuildResult:
        """Build in an isolated subprocess with the profile's timeout; ``out_dir`` must not exist."""
        ...

    def load(self, engine_dir: Path) -> Runner:
        """A runner over the engine; refuses an engine built for another host."""
        ...

    def preflight(self, engine_dir: Path) -> None:
        """Load or deserialize the engine on this host without serving it."""
        ...

    records_host: ClassVar[bool]
    """Whether this backend's trees record the host they were made for, so :meth:`check_tree` can
    refuse another host's without running anything (trtllm's plans record nothing of it: TensorRT's
    deserialize in preflight is the only check)."""

    def check_tree(self, engine_dir: Path, fingerprint: Fingerprint) -> None:
        """Refuse, without running it, a tree recorded for another host than ``fingerprint``: another
        compat key (naming each hard field that differs) or, for a bundle, a cache made elsewhere. What
        ``buildctl import`` checks before it publishes a tree built elsewhere."""
        ...
