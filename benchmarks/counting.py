"""A Store that counts the requests it makes of the store under it, as S3 would bill them.

Every call is one request, except ``list``: S3's ListObjectsV2 returns at most 1,000 keys a page,
so a listing costs ``max(1, ceil(keys / 1000))`` requests. Used by the fleet-scale benchmark and by
the tests that bound a poll's requests.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from typing import Any, Iterator

LIST_PAGE = 1000


class CountingStore:
    """Wraps a Store; ``counts`` holds requests per method, ``total()`` their sum."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.counts: Counter[str] = Counter()
        self.by_area: Counter[tuple[str, str]] = Counter()  # (method, the key's first segment)
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr) or name.startswith("_"):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self._count(name, area=args[0] if args and isinstance(args[0], str) else "")
            return attr(*args, **kwargs)

        return counted

    def _count(self, name: str, n: int = 1, area: str = "") -> None:
        with self._lock:
            self.counts[name] += n
            self.by_area[(name, area.split("/", 1)[0])] += n

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[str]:
        keys = list(self.inner.list(prefix, start_after=start_after))
        self._count("list", max(1, math.ceil(len(keys) / LIST_PAGE)), prefix)
        return iter(keys)

    def total(self) -> int:
        return sum(self.counts.values())

    def reset(self) -> None:
        with self._lock:
            self.counts.clear()
            self.by_area.clear()
