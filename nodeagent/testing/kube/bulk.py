"""Creating many objects on the test control plane quickly: raw JSON over a pooled connection per
thread, as the admin, many requests in flight.

The generated client's models cost more CPU per object than the API server does; for tens of
thousands of nodes and pods (the tiering benchmark) the bodies are plain dicts sent as JSON.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import urllib3

from nodeagent.testing.kube.controlplane import ControlPlane, ControlPlaneError
from nodeagent.testing.kube.nodes import node_manifest, node_status

JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Write:
    """One request: method, path, body, content type."""

    method: str
    path: str
    body: JSON
    content_type: str = "application/json"


class BulkWriter:
    """Sends batches of writes from ``threads`` threads; each batch's writes go in order."""

    def __init__(self, plane: ControlPlane, threads: int = 16) -> None:
        self.url = plane.url
        self.threads = threads
        self.pool = urllib3.PoolManager(
            num_pools=2,
            maxsize=threads,
            ca_certs=str(plane.ca.cert_path),
            cert_reqs="CERT_REQUIRED",
            retries=urllib3.Retry(connect=5, read=0, backoff_factor=0.1),
        )
        self.headers = {"Authorization": f"Bearer {plane.admin.token}"}

    def run(self, batches: Iterable[Sequence[Write]]) -> int:
        """Send every batch; returns how many requests were sent. Raises ControlPlaneError on
        the first refusal (an existing object, 409, counts as done)."""
        with ThreadPoolExecutor(self.threads) as pool:
            return sum(pool.map(self._batch, batches, chunksize=64))

    def _batch(self, writes: Sequence[Write]) -> int:
        for write in writes:
            resp = self.pool.request(
                write.method,
                self.url + write.path,
                body=json.dumps(write.body).encode(),
                headers={**self.headers, "Content-Type": write.content_type},
            )
            if resp.status >= 300 and resp.status != 409:
                raise ControlPlaneError(
                    f"kube-apiserver answered {resp.status} to {write.method} {write.path}: "
                    f"{resp.data[:300]!r}"
                )
        return len(writes)


def node_writes(
    name: str, labels: dict[str, str], *, gpus: int | None = 8, annotations: JSON | None = None
) -> list[Write]:
    """Create a Ready node: the object, then its status (as :func:`nodes.create_node`)."""
    return [
        Write("POST", "/api/v1/nodes", node_manifest(name, labels, annotations=annotations)),
        Write(
            "PATCH",
            f"/api/v1/nodes/{name}/status",
            node_status(gpus=gpus),
            "application/merge-patch+json",
        ),
    ]


def pod_write(namespace: str, pod: JSON) -> list[Write]:
    """Create one pod."""
    return [Write("POST", f"/api/v1/namespaces/{namespace}/pods", pod)]
