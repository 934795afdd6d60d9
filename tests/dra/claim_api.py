"""ResourceClaims served over HTTP on loopback, the way kube-apiserver serves a GET of one, for
the driver's real API reader
(:class:`nodeagent_dra.resource_api.ApiClaims` on the kubernetes client).

It serves exactly the bytes a test stores (so an answer may be malformed, or not JSON at all),
answers 404 with a ``Status`` for a claim it does not hold, can be slow per claim, and counts
the reads and how many were in flight at once.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kubernetes import client

_PATH = re.compile(r"^/apis/resource\.k8s\.io/v1/namespaces/([^/]+)/resourceclaims/([^/?]+)")


@dataclass
class ClaimApi:
    """The stored answers by (namespace, name); ``delay_s`` per claim name (``"*"``: any)."""

    answers: dict[tuple[str, str], bytes] = field(default_factory=dict)
    delay_s: dict[str, float] = field(default_factory=dict)
    reads: int = 0
    in_flight: int = 0
    most_in_flight: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _closing: threading.Event = field(default_factory=threading.Event)
    _server: ThreadingHTTPServer | None = None

    def add(self, claim: dict[str, Any]) -> tuple[str, str, str]:
        """Store a claim (a dict shaped like the API's); its (namespace, uid, name)."""
        meta = claim["metadata"]
        self.answers[(meta["namespace"], meta["name"])] = json.dumps(claim).encode()
        return meta["namespace"], meta["uid"], meta["name"]

    def add_raw(self, namespace: str, name: str, body: bytes) -> None:
        """Store an answer as bytes, whatever they are."""
        self.answers[(namespace, name)] = body

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def api_client(self) -> Any:
        """A kubernetes client for this server, as the agent builds one (no retries)."""
        config = client.Configuration(host=self.url)
        config.retries = 0
        return client.ApiClient(config)

    def _answer(self, path: str) -> tuple[int, bytes]:
        match = _PATH.match(path)
        if match is None:
            return 404, b'{"kind":"Status","code":404}'
        namespace, name = match.groups()
        delay = self.delay_s.get(name, self.delay_s.get("*", 0.0))
        if delay:
            self._closing.wait(delay)
        body = self.answers.get((namespace, name))
        if body is None:
            status = {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                      "reason": "NotFound", "code": 404,
                      "message": f'resourceclaims.resource.k8s.io "{name}" not found'}  # fmt: skip
            return 404, json.dumps(status).encode()
        return 200, body

    def start(self) -> None:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with api._lock:
                    api.reads += 1
                    api.in_flight += 1
                    api.most_in_flight = max(api.most_in_flight, api.in_flight)
                try:
                    code, body = api._answer(self.path)
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the client gave up (its timeout): nothing to answer
                finally:
                    with api._lock:
                        api.in_flight -= 1

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                # A client that gave up on its deadline can close before its request is read;
                # that is the case under test, not a fault of this server. Anything else shows.
                if not isinstance(sys.exc_info()[1], OSError):
                    super().handle_error(request, client_address)

        server = Server(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        self._server = server
        threading.Thread(target=server.serve_forever, daemon=True, name="claim-api").start()

    def stop(self) -> None:
        self._closing.set()  # slow answers end now
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


@contextmanager
def claim_api() -> Iterator[ClaimApi]:
    """A running :class:`ClaimApi`, stopped at the end of the block."""
    api = ClaimApi()
    api.start()
    try:
        yield api
    finally:
        api.stop()
