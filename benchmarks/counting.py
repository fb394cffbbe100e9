"""A Store that counts the requests it makes of the store under it, as S3 would bill them.

Every call is one request, except ``list``: S3's ListObjectsV2 returns at most 1,000 keys a page,
so a listing costs ``max(1, ceil(keys read / 1000))`` requests, counted as the caller reads them. Used by the fleet-scale benchmark and by
the tests that bound a poll's requests.
"""

from __future__ import annotations

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
        """Counted as S3 pages the caller reads: the first when it starts reading, then one more
        each time it reads past 1,000 keys (a caller that stops early pays only its pages)."""
        self._count("list", 1, prefix)
        for i, key in enumerate(self.inner.list(prefix, start_after=start_after)):
            if i and i % LIST_PAGE == 0:
                self._count("list", 1, prefix)
            yield key

    def total(self) -> int:
        return sum(self.counts.values())

    def reset(self) -> None:
        with self._lock:
            self.counts.clear()
            self.by_area.clear()
