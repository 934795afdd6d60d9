"""The pods of this node from the API server: pod UID -> name, container ID -> container name.

A process's cgroup names its pod by UID and its container by runtime ID; the kubelet's
pod-resources API names pods by namespace and name only. This index joins the two, so that each
pod on a shared GPU gets its own numbers. It is polled (one LIST of this node's pods, field
selector ``spec.nodeName``) at the pod-resources pace, off the render and scrape paths; a failed
poll keeps the last index.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException

from nodeagent.workloads import PodIndex

log = logging.getLogger(__name__)


def container_id(raw: str | None) -> str | None:
    """``containerd://<id>`` (or ``cri-o://``, ``docker://``) -> ``<id>``."""
    if not raw:
        return None
    return raw.rpartition("://")[2] or None


def index_from(pods: Iterable[Any]) -> PodIndex:
    """A :class:`PodIndex` from ``V1Pod`` objects (the client's models)."""
    by_uid: dict[str, tuple[str, str]] = {}
    containers: dict[str, tuple[str, str]] = {}
    for pod in pods:
        meta = pod.metadata
        if meta is None or not meta.uid:
            continue
        by_uid[meta.uid] = (meta.namespace or "", meta.name or "")
        status = pod.status
        statuses = [
            *((status.container_statuses or []) if status is not None else []),
            *((status.init_container_statuses or []) if status is not None else []),
        ]
        for cs in statuses:
            cid = container_id(cs.container_id)
            if cid is not None:
                containers[cid] = (meta.uid, cs.name)
    return PodIndex(by_uid, containers)


@dataclass(eq=False)
class PodIndexPoller:
    """Lists this node's pods every ``interval_s``; ``latest`` is the last good index."""

    api: Any
    node_name: str
    interval_s: float
    _: KW_ONLY
    request_timeout_s: float = 5.0
    latest: PodIndex | None = field(default=None, init=False)
    polls: int = field(default=0, init=False)
    _failing: bool = field(default=False, init=False)

    @property
    def failing(self) -> bool:
        """Whether the last list failed (``latest`` is then older than one interval)."""
        return self._failing

    def poll(self) -> PodIndex | None:
        """List once; keeps (and returns) the last index when the API server fails."""
        self.polls += 1
        try:
            listed = self.api.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={self.node_name}",
                _request_timeout=self.request_timeout_s,
            )
        except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            if not self._failing:
                log.warning(
                    "listing the pods of node %s failed (%s); process attribution keeps the "
                    "last list until it answers",
                    self.node_name,
                    getattr(exc, "reason", exc),
                )
            self._failing = True
            return self.latest
        if self._failing:
            log.info("listing the pods of node %s works again", self.node_name)
        self._failing = False
        self.latest = index_from(listed.items)
        return self.latest

    def run(self, stop: threading.Event) -> None:
        """Poll until ``stop`` is set."""
        while not stop.is_set():
            self.poll()
            stop.wait(self.interval_s)
