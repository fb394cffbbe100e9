"""A small HTTP proxy in front of the S3 server on 127.0.0.1: every ``every``-th request is
answered 503 SlowDown or 500 InternalError instead of being forwarded (``every=0``: never), and
with ``rate`` each connection moves at most that many bytes per second each way, as one S3 GET
or PUT stream is capped in the real service (benchmarks/transfer.py --cap)."""

from __future__ import annotations

import http.client
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


class FaultProxy:
    def __init__(self, upstream_port: int, every: int = 4, rate: float | None = None) -> None:
        self.upstream_port, self.every, self.rate = upstream_port, every, rate
        self.requests = self.injected = 0
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def _throttle(self, n: int) -> None:
                """Pace this connection to ``rate`` bytes/s (no credit for idle time)."""
                now = time.monotonic()
                start = max(now, getattr(self, "_free_at", now))
                self._free_at = start + n / proxy.rate
                if self._free_at > now:
                    time.sleep(self._free_at - now)

            def _read_body(self, n: int) -> bytes:
                if not proxy.rate:
                    return self.rfile.read(n)
                parts = []
                while n > 0:
                    chunk = self.rfile.read(min(n, 256 * 1024))
                    if not chunk:
                        break
                    self._throttle(len(chunk))
                    parts.append(chunk)
                    n -= len(chunk)
                return b"".join(parts)

            def _write_body(self, data: bytes) -> None:
                if not proxy.rate:
                    self.wfile.write(data)
                    return
                view = memoryview(data)
                for i in range(0, len(data), 256 * 1024):
                    self._throttle(min(256 * 1024, len(data) - i))
                    self.wfile.write(view[i:i + 256 * 1024])

            def _handle(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self._read_body(n) if n else b""
                with proxy._lock:
                    proxy.requests += 1
                    fail = proxy.every > 0 and proxy.requests % proxy.every == 0
                    if fail:
                        proxy.injected += 1
                        kind = proxy.injected % 2
                if fail:
                    code, name = (503, "SlowDown") if kind else (500, "InternalError")
                    err = f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{name}</Code><Message>injected</Message></Error>".encode()
                    self.send_response(code)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(err)))
                    self.end_headers()
                    self.wfile.write(err)
                    return
                conn = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                head = self.command == "HEAD"  # a HEAD answer keeps the object's Content-Length
                for k, v in resp.getheaders():
                    if k.lower() not in HOP and (head or k.lower() != "content-length"):
                        self.send_header(k, v)
                if not head:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self._write_body(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FaultProxy":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
