"""The engine backend interface: build for this host, load for generation, preflight on a node.

A backend has three operations:

* ``build(profile, model_dir, out_dir, fingerprint, log_path) -> BuildResult``, always in an
  isolated subprocess with the profile's timeout;
* ``load(engine_dir) -> Runner``;
* ``preflight(engine_dir)``: load or deserialize the engine on this host without serving it.

A :class:`Runner` generates greedily from token-id prompts. The validators use the same
interface for the vLLM reference, so comparison code does not care which side is which.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Protocol, runtime_checkable

from engines.fingerprint import Fingerprint
from engines.profile import BuildProfile


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
    name: str

    def build(self, profile: BuildProfile, model_dir: Path, out_dir: Path, fingerprint: Fingerprint,
              log_path: Path) -> BuildResult:
        ...

    def load(self, engine_dir: Path) -> Runner:
        ...

    def preflight(self, engine_dir: Path) -> None:
        ...


def get_backend(name: str) -> EngineBackend:
    """The backend named in a profile or manifest."""
    if name == "aoti":
        from engines.aoti import AotiBackend

        return AotiBackend()
    if name == "trtllm":
        from engines.trtllm import TrtllmBackend

        return TrtllmBackend()
    raise ValueError(f"unknown backend {name!r}")
