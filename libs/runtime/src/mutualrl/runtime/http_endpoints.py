"""``/metrics`` (Prometheus text format) and ``/healthz`` for every service, on a small
threaded HTTP server beside the service's own port."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

Health = Callable[[], dict]
"""Returns at least ``{"status": "ok" | "starting" | "degraded" | "down"}``; 200 only for ok."""


class OpsServer:
    """A service's operations endpoint: /metrics and /healthz."""
    def __init__(self, registry: CollectorRegistry, health: Health, host: str = "127.0.0.1", port: int = 0):
        registry_, health_ = registry, health

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server API
                if self.path.split("?")[0] == "/metrics":
                    body, ctype, code = generate_latest(registry_), CONTENT_TYPE_LATEST, 200
                elif self.path.split("?")[0] == "/healthz":
                    state = health_()
                    body, ctype = json.dumps(state).encode(), "application/json"
                    code = 200 if state.get("status") == "ok" else 503
                else:
                    body, ctype, code = b"not found; try /metrics or /healthz\n", "text/plain", 404
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:  # scrapes are not news
                pass

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="ops-http", daemon=True)

    def start(self) -> "OpsServer":
        """Serve /healthz and /metrics on a background thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self.httpd.shutdown()
        self.httpd.server_close()
