"""How publish and garbage collection share blobs without a lock.

A publish skips uploading a blob the store already has. If garbage collection removed that blob
between the publish's check and its manifest, the new artifact would be born broken. The
protocol (docs/store-layout.md has the timeline):

* **publish** writes a *touch* (``touches/blobs/<hex>.json``: the time, compare-and-swap) for
  every blob it will reference *before* it checks or uploads any; it trusts a blob it did not
  upload only after checking it again at least ``delete_window_s`` after that touch (uploading
  it again if it is gone); and it writes its manifest within ``grace_s / 2`` of its touches
  (touching again if the publish took longer).
* **gc** removes a blob only if no manifest listed in this run references it, its touch (if any)
  is older than ``grace_s`` when checked, that check is within ``grace_s / 2`` of the manifest
  listing, and the removal follows the check within ``delete_window_s`` (otherwise it leaves the
  blob for the next run).

Why that is enough: for gc to remove a blob a publish relies on, gc's check must come before the
publish's touch (a later check sees a fresh touch), so the removal comes before touch +
``delete_window_s``, which is before the publish's second check: the publish sees the blob gone
and uploads it again. And a touch older than ``grace_s`` at gc's check means the manifest was
written more than ``grace_s / 2`` before it, so before the listing, which then holds it. Only
durations are compared across machines, and wall-clock times only against a margin of
``grace_s / 2``: clock skew must stay well below that (12 h by default).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Iterable

from pydantic import Field

from buildctl.core.records import Record
from buildctl.core.settings import Settings
from buildctl.core.digest import canonical_json
from buildctl.artifact_store.backends.store import Store
from buildctl.artifact_store.layout import touch_key
from buildctl.core.times import now_utc, parse_utc, utc_now

# The defaults live in the settings (one place); a caller without settings gets the same values.
DEFAULT_GRACE_S: float = Settings.model_fields["gc_grace_s"].default
DEFAULT_DELETE_WINDOW_S: float = Settings.model_fields["gc_delete_window_s"].default


class GraceWindows(Record):
    """The grace period and delete window that publish and gc both keep (None: the settings'
    default, ``gc_grace_s`` and ``gc_delete_window_s``)."""

    grace_s: float | None = Field(None, ge=0, description="see the module docstring")
    delete_window_s: float | None = Field(None, ge=0, description="see the module docstring")

    @classmethod
    def from_settings(cls, settings: Settings) -> "GraceWindows":
        return cls(grace_s=settings.gc_grace_s, delete_window_s=settings.gc_delete_window_s)

    def seconds(self) -> tuple[float, float]:
        """The grace period and the delete window, the defaults filled in."""
        return (DEFAULT_GRACE_S if self.grace_s is None else self.grace_s,
                DEFAULT_DELETE_WINDOW_S if self.delete_window_s is None else self.delete_window_s)


class Touch(Record):
    """A touch record's body."""

    touched_at: str


def touch(store: Store, digests: Iterable[str], workers: int = 8) -> None:
    """Record that a publish relies on these blobs now. A lost compare-and-swap means another
    publish touched the blob at the same moment, which serves as well."""

    def one(digest: str) -> None:
        key = touch_key(digest)
        got = store.get_ref(key)
        store.cas(key, canonical_json({"touched_at": utc_now()}), got[1] if got else None)

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        list(pool.map(one, sorted(set(digests))))


def touched_at(store: Store, digest: str) -> datetime | None:
    """When a publish last touched the blob; ``None`` if never."""
    got = store.get_ref(touch_key(digest))
    if got is None:
        return None
    try:
        return parse_utc(Touch.model_validate_json(got[0]).touched_at)
    except ValueError:  # pydantic's ValidationError is one
        return now_utc()  # unreadable: assume it is fresh (gc keeps the blob; scrub names it)
