"""Hard fields, soft fields and floors: what a change of a host's fingerprint means for an engine.

Each backend declares, in its class, the fingerprint fields its engines depend on, each of one kind:

* **hard**: a change means the bytes cannot work (the runtime refuses them), so rebuild. The
  compat key hashes only these.
* **soft**: a change may break loading or numerics, so re-check the existing bytes (preflight,
  parity and speed) before rebuilding. An artifact is *covered* for the soft values it passed
  validation on.
* **floors**: requirements, not identity (the driver at least the CUDA runtime's minimum). A host
  below a floor cannot run the engine at all.

Fields are named by their path in ``buildctl fingerprint --json`` (``driver_version``,
``cpu.isa_level``, ``gpus.sm`` for every GPU's SM): the same paths a TARGET file of
``buildctl upgrade`` sets. Each field names its upstream source: an error text or a document.

Compat keys of schema 1 (before this split) hashed every field that mattered at all; the old
keys are still computed (:func:`legacy_compat_key`) so that channels written under them keep
resolving until ``buildctl migrate-keys`` re-points them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal

from buildctl.core.digest import digest_json, hex_of

# The compat-key scheme: hashed into every key, so a key of this scheme never equals an older one.
COMPAT_KEY_SCHEME = 2


@dataclass(frozen=True)
class CompatField:
    """One fingerprint field a backend's engines depend on."""

    path: str  # "driver_version", "cpu.isa_level", "gpus.sm" (each GPU's, as a sorted set)
    kind: Literal["hard", "soft"]
    source: str  # the upstream error text or document this kind is taken from
    part: Literal["value", "major"] = "value"  # major: only the version's first component counts

    @property
    def label(self) -> str:
        """The key of this field in a compat-fields mapping: the path, with ``:major`` for a part."""
        return self.path if self.part == "value" else f"{self.path}:{self.part}"


@dataclass(frozen=True)
class Floor:
    """A requirement a host must meet to run an engine: ``check(host, built_on)`` gives why it does
    not (``None``: it does). ``built_on`` is the fingerprint the engine was built on, when known."""

    name: str
    paths: tuple[str, ...]  # the fingerprint fields it reads
    source: str
    check: Callable[[dict[str, Any], dict[str, Any] | None], str | None]


def value_at(fingerprint: dict[str, Any], path: str) -> Any:
    """The value at ``path`` of a fingerprint's JSON; a path through the GPU list gives the sorted
    set of every GPU's value (``gpus.sm`` -> ``["9.0"]``)."""
    head, _, rest = path.partition(".")
    value = fingerprint.get(head)
    if head == "gpus":
        items = value or []
        return sorted({str(g.get(rest)) for g in items}) if rest else items
    if rest:
        return value_at(value or {}, rest)
    if isinstance(value, list):
        return list(value)
    return value


def major(version: str | None) -> str | None:
    if not version:
        return None
    return version.split(".", 1)[0]


def field_values(fingerprint: dict[str, Any], fields: tuple[CompatField, ...], kind: str) -> dict[str, Any]:
    """``{label: value}`` of the fields of ``kind``."""
    out = {}
    for f in fields:
        if f.kind != kind:
            continue
        v = value_at(fingerprint, f.path)
        out[f.label] = major(v) if f.part == "major" and isinstance(v, str) else v
    return out


def compat_key_of(backend: str, hard: dict[str, Any]) -> str:
    """``<backend>-<32 hex>`` over the backend's hard values (and the scheme)."""
    return f"{backend}-{hex_of(digest_json({'backend': backend, 'scheme': COMPAT_KEY_SCHEME, **hard}))}"


def legacy_compat_key(backend: str, legacy_fields: dict[str, Any]) -> str:
    """A schema-1 compat key, exactly as buildctl computed it before the hard/soft split."""
    return f"{backend}-{hex_of(digest_json({'backend': backend, **legacy_fields}))}"


def floor_problems(floors: tuple[Floor, ...], host: dict[str, Any], built_on: dict[str, Any] | None) -> list[str]:
    """Every floor ``host`` is below, as ``name: why``."""
    return [f"{f.name}: {why}" for f in floors if (why := f.check(host, built_on)) is not None]


def differences(mine: dict[str, Any], theirs: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Labels whose values differ, as ``{label: (mine, theirs)}``."""
    return {k: (mine.get(k), theirs.get(k)) for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)}


def version_tuple(version: str | None) -> tuple[int, ...] | None:
    """``"580.65.06"`` -> ``(580, 65, 6)``; ``None`` when it does not parse."""
    if not version:
        return None
    try:
        return tuple(int(p) for p in version.split("."))
    except ValueError:
        return None


# The lowest driver each CUDA major's runtime runs on (NVIDIA's CUDA compatibility guide, "CUDA
# Toolkit and minimum required driver version"); newer drivers run older runtimes.
MIN_DRIVER_FOR_CUDA_MAJOR = {"11": (450, 80, 2), "12": (525, 60, 13), "13": (580, 0, 0)}


def _driver_floor(host: dict[str, Any], built_on: dict[str, Any] | None) -> str | None:
    cuda = major(host.get("cuda_version") or (built_on or {}).get("cuda_version"))
    need = MIN_DRIVER_FOR_CUDA_MAJOR.get(cuda or "")
    have = version_tuple(host.get("driver_version"))
    if need is None or not host.get("gpus"):
        return None
    if have is None:
        return f"CUDA {cuda} needs driver >= {'.'.join(map(str, need))}: this host reports none"
    if have < need:
        return f"CUDA {cuda} needs driver >= {'.'.join(map(str, need))}: this host has {host['driver_version']}"
    return None


# The floor of every backend that runs CUDA (trtllm, trtllm-torch, vllm on a GPU).
CUDA_DRIVER_FLOORS: tuple[Floor, ...] = (
    Floor("driver >= the CUDA runtime's minimum", ("driver_version", "cuda_version"),
          "NVIDIA CUDA compatibility guide: CUDA 13.x needs a driver >= 580, 12.x >= 525; newer drivers run older "
          "runtimes", _driver_floor),
)
