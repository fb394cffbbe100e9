"""The engine backends by name: one registration line per backend.

Everything a backend knows lives in its own module (its class implements
:class:`~buildctl.engines.backend.EngineBackend`). To add a backend, write that module and add
one line to :data:`BACKENDS`. The classes are imported on first use; importing a backend module
imports no heavy runtime (torch, TensorRT): those load inside build, load and preflight.

This module imports no backend and no engine module (only for type checking): it sits below them,
so the profile and fingerprint modules read backend names and rules from it with no import
circle (tests/test_architecture.py fails on any circle inside the package).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, cast

from buildctl.engines.errors import EngineLoadError, UnknownBackendError

if TYPE_CHECKING:
    from buildctl.engines.backend import EngineBackend
    from buildctl.core.settings import Settings

BACKENDS: dict[str, str] = {
    "trtllm": "buildctl.engines.trtllm.backend:TrtllmBackend",
    "aoti": "buildctl.engines.aoti.backend:AotiBackend",
    "vllm": "buildctl.engines.vllm.bundle:VllmBackend",
    "trtllm-torch": "buildctl.engines.trtllm_torch.backend:TrtllmTorchBackend",
}

# The backends whose artifact is a runtime's start-up state (caches), not an engine: validated with
# the warm-start gate (did the runtime use the caches, is a warm start faster than a cold one), and
# served through ``buildctl node env``.
BUNDLE_BACKENDS: tuple[str, ...] = ("vllm", "trtllm-torch")

if TYPE_CHECKING:  # mypy checks each registered class against the protocol (tests/test_architecture.py)
    from buildctl.engines.aoti.backend import AotiBackend
    from buildctl.engines.trtllm.backend import TrtllmBackend
    from buildctl.engines.trtllm_torch.backend import TrtllmTorchBackend
    from buildctl.engines.vllm.bundle import VllmBackend

    _REGISTERED: tuple[type[EngineBackend], ...] = (TrtllmBackend, AotiBackend, VllmBackend, TrtllmTorchBackend)


def backend_names() -> tuple[str, ...]:
    """Every registered backend name, in registration order."""
    return tuple(BACKENDS)


def backend_class(name: str) -> type[EngineBackend]:
    """The class of backend ``name``; an unknown name is a :class:`UnknownBackendError`."""
    target = BACKENDS.get(name)
    if target is None:
        raise UnknownBackendError(name, backend_names())
    module, _, attr = target.partition(":")
    return cast("type[EngineBackend]", getattr(importlib.import_module(module), attr))


def get_backend(name: str, settings: Settings) -> EngineBackend:
    """Backend ``name``, configured with ``settings``."""
    return backend_class(name)(settings)


def backend_of_engine_dir(engine_dir: str | Path) -> str:
    """Which backend an engine directory belongs to, from its files."""
    d = Path(engine_dir)
    for name in BACKENDS:
        if backend_class(name).recognises(d):
            return name
    raise EngineLoadError(str(d), f"not an engine directory of any backend ({', '.join(BACKENDS)})")
