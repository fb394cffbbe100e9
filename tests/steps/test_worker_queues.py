"""buildctl/steps/worker_queues.py without a Prefect server: a busy server's 503 is asked again (urllib3's
Retry), a 404 is None, and a refusal or an unreachable API is one PrefectApiError (exit 9)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from buildctl.steps.worker_queues import PrefectApi, PrefectApiError, WorkPoolNotFoundError


@pytest.fixture
def server():
    answers: list[int] = []
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            seen.append(f"{self.command} {self.path}")
            code = answers.pop(0) if answers else 200
            body = json.dumps({"name": "gpu"}).encode() if code == 200 else b"{}"
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PATCH = _answer

        def log_message(self, *args) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/api", answers, seen
    httpd.shutdown()


def test_a_busy_servers_503s_are_asked_again(server):
    url, answers, seen = server
    answers += [503, 503]
    assert PrefectApi(url).pool("gpu") == {"name": "gpu"}
    assert seen == ["GET /api/work_pools/gpu"] * 3


def test_404_is_none_and_a_refusal_or_no_server_is_one_error(server):
    url, answers, _ = server
    answers += [404]
    with pytest.raises(WorkPoolNotFoundError, match="prefect work-pool create gpu"):
        PrefectApi(url).pool("gpu")
    answers += [409]
    with pytest.raises(PrefectApiError, match="HTTP 409"):
        PrefectApi(url).call("POST", "/work_pools/gpu/queues", {"name": "q"})
    with pytest.raises(PrefectApiError, match="127.0.0.1:9"):
        PrefectApi("http://127.0.0.1:9/api", timeout=2).call("GET", "/health")
