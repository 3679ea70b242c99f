"""A JSON-over-HTTP request handler for the stand-in engine servers of the adapter tests."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import Callable
from urllib.parse import urlparse

Respond = Callable[[str, str, str, dict], tuple[int, object]]
"""``respond(method, path, query, body) -> (status, json-able answer)``."""


def json_handler(respond: Respond) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _do(self, method: str) -> None:
            url = urlparse(self.path)
            n = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(n) or b"{}") if n else {}
            code, out = respond(method, url.path, url.query, body)
            data = json.dumps(out).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802
            self._do("GET")

        def do_POST(self):  # noqa: N802
            self._do("POST")

        def log_message(self, *a):
            pass

    return Handler
