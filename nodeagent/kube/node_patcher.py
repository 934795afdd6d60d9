"""Patch this node's condition, labels, annotations and taint through the API server.

Only this module talks to Kubernetes for the health feature. It computes the smallest patch that
turns what it last applied into what is wanted and sends nothing when nothing changed. Errors
come out as :class:`KubeUnavailableError`; the caller retries with backoff and, because the adapter
always sends the *latest* wanted flags, catches up in one round when the API server returns.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from nodeagent import labels
from nodeagent.config.kubernetes import KubernetesSection
from nodeagent.kube.client import NoCredentialsError, api_client

log = logging.getLogger(__name__)

CONDITION_TYPE = labels.GPU_HEALTHY_CONDITION
TAINT_KEY = labels.UNSTABLE_TAINT
STRATEGIC = "application/strategic-merge-patch+json"
_MAX_MESSAGE = 1024  # keep the condition message readable in `kubectl describe node`


class KubeUnavailableError(Exception):
    """The API server could not be reached or refused the request (retry later)."""


@contextmanager
def api_errors(what: str) -> Iterator[None]:
    """Raise the kubernetes client's failures of a request as :class:`KubeUnavailableError`.

    ``what`` completes "API server answered 403 Forbidden ..." (e.g. "for node gpu-1"); the
    start of the answer's body, where there is one, says why.
    """
    try:
        yield
    except ApiException as exc:
        body = f": {exc.body[:300]}" if exc.body else ""
        raise KubeUnavailableError(
            f"API server answered {exc.status} {exc.reason} {what}{body}"
        ) from exc
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise KubeUnavailableError(f"API server unreachable {what}: {exc}") from exc


@dataclass(frozen=True, slots=True)
class NodeFlags:
    """What the node should carry: the condition, labels, annotations and the taint."""

    healthy: bool  # condition status True/False
    reason: str  # CamelCase condition reason
    message: str
    labels: tuple[tuple[str, str], ...]
    annotations: tuple[tuple[str, str], ...]
    taint: bool  # whether the NoSchedule taint should be present


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class NodePatcher:
    """Applies :class:`NodeFlags` to one node.

    Args:
        node_name: the node to patch (downward API ``NODE_NAME`` in the DaemonSet).
        api: a ``CoreV1Api``; build one with :func:`make_api`.
    """

    node_name: str
    api: Any
    request_timeout_s: float = 5.0
    applied: NodeFlags | None = None  # last flags the API server accepted
    _transition_time: str | None = field(default=None, repr=False)
    patches_sent: int = 0

    def apply(self, flags: NodeFlags) -> bool:
        """Patch what differs from the last applied flags; returns whether anything was sent.

        Raises:
            KubeUnavailableError: the API server is unreachable or rejected the patch.
        """
        if flags == self.applied:
            return False
        with api_errors(f"for node {self.node_name}"):
            self._apply(flags)
        self.applied = flags
        return True

    def _apply(self, flags: NodeFlags) -> None:
        old = self.applied
        node = None
        if old is None:
            # First contact (or after a restart): read the node so an unchanged condition keeps
            # its lastTransitionTime and so we know which taints are there.
            node = self.api.read_node(self.node_name, _request_timeout=self.request_timeout_s)
            self._transition_time = _existing_transition(node, flags.healthy)
        if old is None or (old.healthy, old.reason, old.message) != (
            flags.healthy,
            flags.reason,
            flags.message,
        ):
            now = _now()
            if (old is not None and old.healthy != flags.healthy) or self._transition_time is None:
                self._transition_time = now
            condition = {
                "type": CONDITION_TYPE,
                "status": "True" if flags.healthy else "False",
                "reason": flags.reason,
                "message": flags.message[:_MAX_MESSAGE],
                "lastHeartbeatTime": now,
                "lastTransitionTime": self._transition_time,
            }
            self.api.patch_node_status(
                self.node_name,
                {"status": {"conditions": [condition]}},
                _content_type=STRATEGIC,
                _request_timeout=self.request_timeout_s,
            )
            self.patches_sent += 1
        meta: dict[str, Any] = {}
        labels = _diff(dict(old.labels) if old else None, dict(flags.labels))
        annotations = _diff(dict(old.annotations) if old else None, dict(flags.annotations))
        if labels:
            meta["labels"] = labels
        if annotations:
            meta["annotations"] = annotations
        body: dict[str, Any] = {}
        if meta:
            body["metadata"] = meta
        if old is None or old.taint != flags.taint:
            if node is None:
                node = self.api.read_node(self.node_name, _request_timeout=self.request_timeout_s)
            taints = _taints_with(node, flags.taint)
            if taints is not None:
                # Taints have no merge key: the whole list is replaced, so send the node's own
                # list with ours added or removed, leaving other controllers' taints alone.
                body["spec"] = {"taints": taints}
        if body:
            self.api.patch_node(
                self.node_name,
                body,
                _content_type=STRATEGIC,
                _request_timeout=self.request_timeout_s,
            )
            self.patches_sent += 1


def _diff(old: dict[str, str] | None, new: dict[str, str]) -> dict[str, str | None]:
    """Keys to set (and to delete, as None) to turn ``old`` into ``new``."""
    if old is None:
        return dict(new)
    out: dict[str, str | None] = {k: v for k, v in new.items() if old.get(k) != v}
    out.update({k: None for k in old if k not in new})
    return out


def _existing_transition(node: Any, healthy: bool) -> str | None:
    status = "True" if healthy else "False"
    for cond in getattr(node.status, "conditions", None) or []:
        if cond.type == CONDITION_TYPE and cond.status == status and cond.last_transition_time:
            value = cond.last_transition_time
            if isinstance(value, dt.datetime):
                return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            return str(value)
    return None


def _taints_with(node: Any, present: bool) -> list[dict[str, Any]] | None:
    """The node's taint list with ours present or absent; None when nothing changes."""
    current = [t for t in (getattr(node.spec, "taints", None) or [])]
    ours = [t for t in current if t.key == TAINT_KEY]
    if present == bool(ours):
        return None
    others = [
        {"key": t.key, "value": t.value, "effect": t.effect} for t in current if t.key != TAINT_KEY
    ]
    if present:
        others.append({"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"})
    return others


def make_api(section: KubernetesSection) -> Any:
    """A ``CoreV1Api`` for ``section``, from :func:`nodeagent.kube.client.api_client`.

    The client's own connection retries are turned off: the reporter retries with its own
    backoff and must not block for long inside one call.

    Raises:
        KubeUnavailableError: no credentials apply (names the fix).
    """
    try:
        api = api_client(server=section.api_server, kubeconfig=section.kubeconfig, retries=0)
    except NoCredentialsError as exc:
        raise KubeUnavailableError(
            f"{exc}; set kubernetes.kubeconfig or kubernetes.api_server"
        ) from exc
    return client.CoreV1Api(api)
