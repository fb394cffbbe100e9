"""Time as buildctl stores and reads it: one module.

Every stored time is UTC ISO-8601 with microseconds and a ``Z`` (``utc_now``); ``parse_utc`` reads
one back (a naive time is taken as UTC); ``after`` adds seconds and writes it the same way;
``parse_duration`` reads the CLI's ``30m``/``2h``/``90s``/``1d``.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

from buildctl.core.errors import BadInputError


def format_utc(t: datetime) -> str:
    """``t`` as a stored time: UTC, ISO-8601, microseconds, ``Z``."""
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return t.astimezone(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def now_utc() -> datetime:
    """Now, as an aware UTC datetime (what a decision compares stored times with)."""
    return datetime.now(timezone.utc)


def utc_now() -> str:
    """Now, as a stored time."""
    return format_utc(now_utc())


def parse_utc(text: str) -> datetime:
    """A stored time (or any ISO-8601 time; naive ones are UTC). Raises ``ValueError`` on junk."""
    t = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def after(text: str, seconds: float) -> str:
    """The stored time ``seconds`` after the stored time ``text``."""
    return format_utc(parse_utc(text) + timedelta(seconds=seconds))


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


# The longest duration any setting or option takes: ten years. Longer ones are typos (99999999999d)
# and would overflow the date arithmetic they feed.
MAX_DURATION_S = 10 * 365 * 86400.0


def parse_duration(text: str) -> float:
    """``30m``, ``2h``, ``90s``, ``1d`` or plain seconds, as seconds (at most :data:`MAX_DURATION_S`)."""
    m = re.match(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$", text or "")
    if not m:
        raise BadInputError(f"duration {text!r}: a number with s, m, h or d, e.g. 30m")
    seconds = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    if seconds > MAX_DURATION_S:
        raise BadInputError(f"duration {text!r}: at most {format_duration(MAX_DURATION_S)}")
    return seconds


def format_duration(seconds: float) -> str:
    """``3600`` -> ``1h``, ``90`` -> ``90s``, ``86400`` -> ``1d``: the largest unit that divides it."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
