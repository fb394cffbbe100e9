"""``python -m buildctl.flows.local --wait-for-api``: ``make demo`` starts its own Prefect server
and the flow's process waits for its health check."""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from buildctl.flows.local import wait_for_api


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200 if self.path == "/api/health" else 404)
        self.end_headers()
        self.wfile.write(b"true")

    def log_message(self, *args) -> None:
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_waits_until_the_server_answers_its_health_check():
    port = _free_port()
    server = HTTPServer(("127.0.0.1", port), _Health)
    late = threading.Timer(0.6, server.serve_forever)  # the server comes up after the wait has begun
    late.start()
    try:
        t0 = time.monotonic()
        wait_for_api(30, url=f"http://127.0.0.1:{port}/api", interval_s=0.05)
        assert time.monotonic() - t0 >= 0.5
    finally:
        server.shutdown()
        server.server_close()
        late.cancel()


def test_a_server_that_never_answers_is_a_one_line_error():
    port = _free_port()
    with pytest.raises(SystemExit, match=rf"the Prefect API at http://127.0.0.1:{port}/api did not answer /health within 0.3s"):
        wait_for_api(0.3, url=f"http://127.0.0.1:{port}/api", interval_s=0.05)
