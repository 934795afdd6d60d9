"""Kubernetes Events about pods and this node, written by the agent (``core/v1`` Events).

One Event per call, on the pod (``involvedObject`` kind Pod with its UID where known), with
``source.component`` ``nodeagent`` and ``source.host`` this node, so ``kubectl describe pod``
shows it next to the kubelet's own. Errors come out as :class:`KubeUnavailableError`.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException

from nodeagent.kube.node_patcher import KubeUnavailableError

COMPONENT = "nodeagent"
_MAX_MESSAGE = 1024


@dataclass(frozen=True, slots=True)
class PodRef:
    """The pod an Event is about."""

    namespace: str
    name: str
    uid: str | None = None


class EventRecorder:
    """Creates Events about pods through a ``CoreV1Api``."""

    def __init__(self, api: Any, node_name: str, *, request_timeout_s: float = 5.0) -> None:
        self.api = api
        self.node_name = node_name
        self.request_timeout_s = request_timeout_s
        self.sent = 0

    def pod_event(self, pod: PodRef, reason: str, message: str, *, warning: bool = True) -> None:
        """Record one Event on ``pod``. Raises KubeUnavailableError when the API refuses it."""
        involved: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": pod.namespace,
            "name": pod.name,
        }
        if pod.uid:
            involved["uid"] = pod.uid
        self._create(pod.namespace, pod.name, involved, reason, message, warning)

    def node_event(self, reason: str, message: str, *, warning: bool = True) -> None:
        """Record one Event on this node (in ``default``, where Events about nodes live)."""
        involved = {"apiVersion": "v1", "kind": "Node", "name": self.node_name}
        self._create("default", self.node_name, involved, reason, message, warning)

    def _create(
        self,
        namespace: str,
        name: str,
        involved: dict[str, Any],
        reason: str,
        message: str,
        warning: bool,
    ) -> None:
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{name}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
            "involvedObject": involved,
            "reason": reason,
            "message": message[:_MAX_MESSAGE],
            "type": "Warning" if warning else "Normal",
            "source": {"component": COMPONENT, "host": self.node_name},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.node_name,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self.api.create_namespaced_event(
                namespace, body, _request_timeout=self.request_timeout_s
            )
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            what = f"{involved['kind'].lower()} {namespace}/{name}"
            raise KubeUnavailableError(
                f"Event {reason} on {what}: {getattr(exc, 'reason', exc)}"
            ) from exc
        self.sent += 1
