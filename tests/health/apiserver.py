"""A small stand-in for the Kubernetes API server: nodes only, over real HTTP on loopback.

It serves ``GET /api/v1/nodes/NAME`` and strategic-merge ``PATCH`` of a node and its status,
applying patches the way the API server does for the fields the agent touches (labels and
annotations merge, ``null`` deletes; taints are replaced whole; conditions merge by ``type``),
and records every request so tests can check paths and bodies. ``stop()`` and ``start()`` on
the same port simulate an API server outage.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    content_type: str
    body: Any
    time_s: float  # time.perf_counter() when received


class _Server(ThreadingHTTPServer):
    allow_reuse_address = True
    daemon_threads = True
    stand_in: FakeApiServer


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet test output
        pass

    def _reply(self, code: int, data: Any) -> None:
        raw = json.dumps(data).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:
        stand_in = self.server.stand_in
        stand_in.record(Request("GET", self.path, "", None, time.perf_counter()))
        node = stand_in.node_for(self.path)
        if node is None:
            self._reply(404, {"kind": "Status", "code": 404, "reason": "NotFound"})
        else:
            self._reply(200, node)

    def do_PATCH(self) -> None:
        stand_in = self.server.stand_in
        length = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(length) or b"null")
        ctype = self.headers.get("Content-Type", "")
        stand_in.record(Request("PATCH", self.path, ctype, body, time.perf_counter()))
        node = stand_in.apply(self.path, body)
        if node is None:
            self._reply(404, {"kind": "Status", "code": 404, "reason": "NotFound"})
        else:
            self._reply(200, node)


class FakeApiServer:
    """One node object behind a loopback HTTP server."""

    def __init__(self, node_name: str = "gpu-node-1") -> None:
        self.node_name = node_name
        self.node: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node_name, "labels": {"kubernetes.io/hostname": node_name},
                         "annotations": {}},
            "spec": {"taints": [{"key": "other.io/maintenance", "value": "x",
                                 "effect": "PreferNoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }  # fmt: skip
        self.requests: list[Request] = []
        self.patched = threading.Condition()
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeApiServer:
        server = _Server(("127.0.0.1", self.port), _Handler)
        server.stand_in = self
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)  # fmt: skip
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def record(self, request: Request) -> None:
        with self.patched:
            self.requests.append(request)
            self.patched.notify_all()

    def patches(self) -> list[Request]:
        with self.patched:
            return [r for r in self.requests if r.method == "PATCH"]

    def condition(self, kind: str = "GPUHealthy") -> dict[str, Any] | None:
        with self._lock:
            for cond in self.node["status"]["conditions"]:
                if cond["type"] == kind:
                    return dict(cond)
        return None

    def wait_for(self, predicate: Any, timeout_s: float = 5.0) -> bool:
        """Wait until ``predicate(self)`` holds after some request."""
        deadline = time.monotonic() + timeout_s
        with self.patched:
            while not predicate(self):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.patched.wait(left)
        return True

    def node_for(self, path: str) -> dict[str, Any] | None:
        if path.split("?")[0] != f"/api/v1/nodes/{self.node_name}":
            return None
        with self._lock:
            return copy.deepcopy(self.node)

    def apply(self, path: str, patch: dict[str, Any]) -> dict[str, Any] | None:
        base = f"/api/v1/nodes/{self.node_name}"
        clean = path.split("?")[0]
        if clean not in (base, base + "/status"):
            return None
        with self._lock:
            node = self.node
            meta = patch.get("metadata", {})
            for field in ("labels", "annotations"):
                for key, value in meta.get(field, {}).items():
                    if value is None:
                        node["metadata"][field].pop(key, None)
                    else:
                        node["metadata"][field][key] = value
            if "taints" in patch.get("spec", {}):
                node["spec"]["taints"] = patch["spec"]["taints"]
            for cond in patch.get("status", {}).get("conditions", []):
                existing = [c for c in node["status"]["conditions"] if c["type"] == cond["type"]]
                if existing:
                    existing[0].update(cond)
                else:
                    node["status"]["conditions"].append(dict(cond))
            return copy.deepcopy(node)
