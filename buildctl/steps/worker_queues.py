"""The work queues of a buildctl work pool, through Prefect's REST API (the CLI never imports Prefect).

A Prefect worker started on a queue that does not exist yet gets a 404 for its whole poll, which
it swallows, so it serves nothing, not even ``default``. ``buildctl worker start`` therefore
creates or verifies each of its compat-key queues first (:func:`ensure_queues`), each described
with its backend, compat key and the key's fields, so the UI says what a queue is for.
``buildctl worker queues`` lists a pool's queues with their last poll and flags Late runs on a
queue that no live worker polls (:func:`queue_report`).
"""

from __future__ import annotations

import json
import socket
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

import urllib3
from urllib3.util.retry import Retry

from buildctl.core.errors import NotFoundError, UnavailableError

#: A queue counts as polled by a live worker when Prefect marks it READY (a poll within the
#: server's heartbeat window).
LIVE_STATUS = "READY"


class PrefectApiError(UnavailableError):
    """The Prefect API did not answer as expected (``url``, ``detail``). Exit 9."""

    def __init__(self, url: str, detail: str) -> None:
        self.url = url
        self.detail = detail
        super().__init__(f"Prefect API {url}: {detail}")


class WorkPoolNotFoundError(NotFoundError):
    """No work pool of that name on the Prefect server. Exit 3."""

    def __init__(self, pool: str) -> None:
        self.pool = pool
        super().__init__(f"work pool {pool!r} not found on the Prefect server: create it first "
                         f"(prefect work-pool create {pool} --type process)")


class PrefectApi:
    """JSON over HTTP to one Prefect API (``PREFECT_API_URL``); ``None`` for a 404. A busy server's
    503 or 429 and a dropped connection are asked again by urllib3's own ``Retry`` (backoff 0.5 s,
    doubling, five times), as Prefect's client does."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        retry = Retry(total=5, backoff_factor=0.5, status_forcelist=(429, 502, 503, 504),
                      allowed_methods=None, raise_on_status=False, respect_retry_after_header=True)
        self._http = urllib3.PoolManager(retries=retry, timeout=urllib3.Timeout(total=timeout))

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            r = self._http.request(method, self.url + path, body=json.dumps(body).encode() if body is not None else None,
                                   headers={"Content-Type": "application/json"})
        except urllib3.exceptions.HTTPError as err:
            raise PrefectApiError(self.url, f"{method} {path}: {err}") from None
        if r.status == 404:
            return None
        if r.status >= 400:
            raise PrefectApiError(self.url, f"{method} {path}: HTTP {r.status} {r.reason}")
        try:
            return json.loads(r.data) if r.data else None
        except ValueError:
            raise PrefectApiError(self.url, f"{method} {path}: the answer is not JSON") from None

    def pool(self, pool: str) -> dict[str, Any]:
        got = self.call("GET", f"/work_pools/{_q(pool)}")
        if got is None:
            raise WorkPoolNotFoundError(pool)
        return got


def _q(name: str) -> str:
    return urllib.parse.quote(name, safe="")


@dataclass(frozen=True)
class QueueSpec:
    """A queue a worker serves: its name and what it is for."""

    name: str
    description: str


def describe_queue(backend: str, compat_key: str, fields: dict[str, Any]) -> str:
    """``buildctl builds for backend aoti, compat key aoti-…: torch 2.9.0, …`` (the key's hard fields)."""
    shown = ", ".join(f"{k} {v}" for k, v in fields.items() if k != "backend")
    return f"buildctl builds for backend {backend}, compat key {compat_key}: {shown}"[:2000]


def worker_name(queues: list[str]) -> str:
    """The default worker name: this host and the compat keys it serves."""
    keys = "+".join(q[:24] for q in queues) or "control"
    return f"{socket.gethostname()}-{keys}"[:200]


def ensure_queues(api: PrefectApi, pool: str, specs: list[QueueSpec]) -> list[tuple[str, str]]:
    """Create each queue that does not exist, with its description, and put the description back on
    one that lost it. Returns (queue, "created" | "updated" | "verified") each. The pool must exist
    (:class:`WorkPoolNotFoundError`)."""
    api.pool(pool)
    out = []
    for spec in specs:
        path = f"/work_pools/{_q(pool)}/queues"
        got = api.call("GET", f"{path}/{_q(spec.name)}")
        if got is None:
            try:
                api.call("POST", path, {"name": spec.name, "description": spec.description})
                out.append((spec.name, "created"))
                continue
            except PrefectApiError as err:
                if "HTTP 409" not in err.detail:  # another worker created it meanwhile: verify it
                    raise
                got = api.call("GET", f"{path}/{_q(spec.name)}") or {}
        if spec.description and (got.get("description") or "") != spec.description:
            api.call("PATCH", f"{path}/{_q(spec.name)}", {"description": spec.description})
            out.append((spec.name, "updated"))
        else:
            out.append((spec.name, "verified"))
    return out


@dataclass
class QueueRow:
    queue: str
    status: str | None
    last_polled: str | None
    paused: bool
    description: str | None
    late_runs: list[str] = field(default_factory=list)

    @property
    def unserved(self) -> bool:
        """Late runs wait here and no live worker polls the queue: someone must start one."""
        return bool(self.late_runs) and self.status != LIVE_STATUS

    def to_json(self) -> dict[str, Any]:
        return {"queue": self.queue, "status": self.status, "last_polled": self.last_polled, "paused": self.paused,
                "description": self.description, "late_runs": self.late_runs, "unserved": self.unserved}


def queue_report(api: PrefectApi, pool: str) -> list[QueueRow]:
    """The pool's queues, each with its Late runs (names)."""
    api.pool(pool)
    queues = api.call("POST", f"/work_pools/{_q(pool)}/queues/filter", {}) or []
    late = api.call("POST", "/flow_runs/filter", {
        "flow_runs": {"state": {"name": {"any_": ["Late"]}}},
        "work_pools": {"name": {"any_": [pool]}}, "limit": 200}) or []
    by_queue: dict[str, list[str]] = {}
    for run in late:
        by_queue.setdefault(run.get("work_queue_name") or "", []).append(run.get("name") or run.get("id", "?"))
    return sorted((QueueRow(q["name"], q.get("status"), q.get("last_polled"), bool(q.get("is_paused")),
                            q.get("description"), sorted(by_queue.get(q["name"], []))) for q in queues),
                  key=lambda r: r.queue)
