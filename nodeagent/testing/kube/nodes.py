"""Nodes without kubelets on a real control plane, the way kwok runs them.

:func:`node_manifest` / :func:`create_node` make a Node whose status says Ready and carries
capacity (``nvidia.com/gpu`` and friends), so kube-scheduler binds pods to it.
:class:`KubeletStandIn` then does for those pods what a kubelet would: it reports a bound pod
Running and Ready (so PodDisruptionBudgets count it healthy), and finishes a pod's deletion once
the API server has marked it (``deletionTimestamp``), as a kubelet does after the containers
stop; without that, evictions and drains never complete.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)

JSON = dict[str, Any]
DEFAULT_CAPACITY = {"cpu": "64", "memory": "512Gi", "pods": "250", "ephemeral-storage": "1Ti"}


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_manifest(
    name: str,
    labels: Mapping[str, str] | None = None,
    *,
    taints: Sequence[Mapping[str, str]] = (),
    unschedulable: bool = False,
    annotations: Mapping[str, str] | None = None,
) -> JSON:
    """A Node object (spec and metadata; the status goes in with :func:`node_status`)."""
    meta: JSON = {
        "name": name,
        "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **(labels or {})},
    }
    if annotations:
        meta["annotations"] = dict(annotations)
    spec: JSON = {}
    if taints:
        spec["taints"] = [dict(t) for t in taints]
    if unschedulable:
        spec["unschedulable"] = True
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta, "spec": spec}


def node_status(capacity: Mapping[str, str] | None = None, gpus: int | None = None) -> JSON:
    """A Ready status with ``capacity`` (allocatable the same), ``gpus`` as ``nvidia.com/gpu``."""
    resources = dict(DEFAULT_CAPACITY)
    if gpus is not None:
        resources["nvidia.com/gpu"] = str(gpus)
    resources.update(capacity or {})
    now = _now()
    return {
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "node without a kubelet, kept Ready by the test harness",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "v0.0.0-harness",
                "bootID": "",
                "containerRuntimeVersion": "",
                "kernelVersion": "",
                "kubeProxyVersion": "",
                "machineID": "",
                "osImage": "",
                "systemUUID": "",
            },
        }
    }


def create_node(
    api: client.ApiClient,
    name: str,
    labels: Mapping[str, str] | None = None,
    *,
    capacity: Mapping[str, str] | None = None,
    gpus: int | None = None,
    taints: Sequence[Mapping[str, str]] = (),
    unschedulable: bool = False,
    annotations: Mapping[str, str] | None = None,
) -> None:
    """Create a Ready node (two writes: the object, then its status subresource)."""
    core = client.CoreV1Api(api)
    core.create_node(
        node_manifest(  # type: ignore[arg-type]  # the client takes plain dicts as well
            name, labels, taints=taints, unschedulable=unschedulable, annotations=annotations
        )
    )
    core.patch_node_status(name, node_status(capacity, gpus))


def pod_manifest(
    name: str,
    *,
    gpus: int = 0,
    resources: Mapping[str, str] | None = None,
    node_name: str | None = None,
    labels: Mapping[str, str] | None = None,
    node_selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping[str, Any]] = (),
    annotations: Mapping[str, str] | None = None,
) -> JSON:
    """A one-container pod requesting ``gpus`` ``nvidia.com/gpu`` (and ``resources``)."""
    limits = dict(resources or {})
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    container: JSON = {"name": "main", "image": "registry.invalid/workload:1"}
    if limits:
        container["resources"] = {"limits": limits, "requests": dict(limits)}
    spec: JSON = {"containers": [container], "terminationGracePeriodSeconds": 30}
    if node_name:
        spec["nodeName"] = node_name
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if tolerations:
        spec["tolerations"] = [dict(t) for t in tolerations]
    meta: JSON = {"name": name, "labels": dict(labels or {})}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def running_status(pod: JSON) -> JSON:
    """The status a kubelet reports for a started pod: Running, every container ready."""
    now = _now()
    containers = pod.get("spec", {}).get("containers", [])
    return {
        "status": {
            "phase": "Running",
            "startTime": now,
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": now}
                for t in ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")
            ],
            "containerStatuses": [
                {
                    "name": c["name"],
                    "image": c.get("image", ""),
                    "imageID": "",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": now}},
                }
                for c in containers
            ],
        }
    }


# Nodes run by a real kubelet (:mod:`.realnode`) carry this label; the stand-in leaves their
# pods to that kubelet.
REAL_KUBELET_LABEL = "test.nodeagent.io/kubelet"


class KubeletStandIn:
    """Runs bound pods and finishes their deletions, for every node without a kubelet (nodes
    labelled :data:`REAL_KUBELET_LABEL` have their own).

    A watch over pods bound to a node drives it; on a watch error (an API server outage, a
    ``410 Gone``) it lists again and carries on, so it survives restarts of kube-apiserver.
    ``run_pods=False`` leaves bound pods Pending (what a benchmark that never needs pods
    Running wants: half the writes). :attr:`grace_periods` records, per ``namespace/name``, the
    grace period a pod's deletion gave it (what a kubelet would allow its containers to stop).
    """

    def __init__(self, api: client.ApiClient, *, run_pods: bool = True) -> None:
        self.core = client.CoreV1Api(api)
        self.run_pods = run_pods
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kubelet-stand-in", daemon=True)
        self._watch: watch.Watch | None = None
        self.synced = threading.Event()
        self.grace_periods: dict[str, int] = {}
        self._real_kubelet: dict[str, bool] = {}

    def start(self) -> KubeletStandIn:
        """Start the watch thread; returns self."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread (at most one watch timeout later)."""
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()  # type: ignore[no-untyped-call]
        self._thread.join(10)

    def __enter__(self) -> KubeletStandIn:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                listed: Any = self.core.list_pod_for_all_namespaces(
                    field_selector="spec.nodeName!=", _preload_content=False
                )
                body = json.loads(listed.data)
                for pod in body.get("items", []):
                    self._handle(pod)
                self.synced.set()
                self._watch = watch.Watch()  # type: ignore[no-untyped-call]
                for event in self._watch.stream(  # type: ignore[no-untyped-call]
                    self.core.list_pod_for_all_namespaces,
                    field_selector="spec.nodeName!=",
                    resource_version=body["metadata"]["resourceVersion"],
                    timeout_seconds=30,
                    allow_watch_bookmarks=True,
                    _preload_content=False,
                ):
                    if self._stop.is_set():
                        return
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._handle(event["raw_object"])
            except Exception as exc:  # noqa: BLE001 - outages and 410s: list again
                if self._stop.is_set():
                    return
                log.debug("kubelet stand-in: %s; listing again", exc)
                self._stop.wait(0.2)

    def _has_kubelet(self, node_name: str) -> bool:
        """Whether a real kubelet runs the node (looked up once: the label is set when the
        kubelet registers the node, before anything can be bound to it)."""
        if node_name not in self._real_kubelet:
            try:
                node = self.core.read_node(node_name)
            except ApiException:
                return False  # deleted already, or not yet known: nothing to decide now
            labels = (node.metadata and node.metadata.labels) or {}
            self._real_kubelet[node_name] = REAL_KUBELET_LABEL in labels
        return self._real_kubelet[node_name]

    def _handle(self, pod: JSON) -> None:
        meta = pod.get("metadata", {})
        name, namespace = meta.get("name"), meta.get("namespace")
        if self._has_kubelet(str(pod.get("spec", {}).get("nodeName"))):
            return
        try:
            if meta.get("deletionTimestamp"):
                self.grace_periods.setdefault(
                    f"{namespace}/{name}", int(meta.get("deletionGracePeriodSeconds") or 0)
                )
                self.core.delete_namespaced_pod(
                    name,
                    namespace,
                    grace_period_seconds=0,
                    body=client.V1DeleteOptions(
                        grace_period_seconds=0,
                        preconditions=client.V1Preconditions(uid=meta.get("uid")),
                    ),
                )
            elif self.run_pods and pod.get("status", {}).get("phase") in (None, "Pending"):
                self.core.patch_namespaced_pod_status(name, namespace, running_status(pod))
        except ApiException as exc:
            if exc.status not in (404, 409):  # gone already, or replaced meanwhile
                log.warning("kubelet stand-in: pod %s/%s: %s", namespace, name, exc.reason)


OWNER_LABEL = "test.nodeagent.io/owner"  # which test made a node (nodes are cluster-wide)


class NodeSet:
    """The nodes of one test on a shared control plane: named ``<prefix>-<suffix>``, labelled
    :data:`OWNER_LABEL` = ``prefix`` (a tier policy's ``nodes`` selector can keep a service to
    them), and deleted by :meth:`delete_all`."""

    def __init__(self, api: client.ApiClient, prefix: str) -> None:
        self.api = api
        self.prefix = prefix
        self.names: list[str] = []

    def name(self, suffix: str) -> str:
        """The full name of node ``suffix``."""
        return f"{self.prefix}-{suffix}"

    def create(
        self,
        suffix: str,
        labels: Mapping[str, str] | None = None,
        *,
        gpus: int | None = 8,
        taints: Sequence[Mapping[str, str]] = (),
        capacity: Mapping[str, str] | None = None,
    ) -> str:
        """Create a Ready node; returns its name."""
        name = self.name(suffix)
        create_node(
            self.api,
            name,
            {OWNER_LABEL: self.prefix, **(labels or {})},
            gpus=gpus,
            taints=taints,
            capacity=capacity,
        )
        self.names.append(name)
        return name

    def get(self, suffix: str) -> JSON:
        """Node ``suffix`` as the API server has it now (raw JSON)."""
        core = client.CoreV1Api(self.api)
        resp: Any = core.read_node(self.name(suffix), _preload_content=False)
        node: JSON = json.loads(resp.data)
        return node

    def patch(self, suffix: str, body: JSON, *, status: bool = False) -> None:
        """A merge patch of node ``suffix`` (or of its status), as another client would send."""
        core = client.CoreV1Api(self.api)
        call = core.patch_node_status if status else core.patch_node
        call(self.name(suffix), body, _content_type="application/merge-patch+json")

    def selector(self) -> JSON:
        """A tier policy ``nodes`` selector for exactly these nodes."""
        return {
            "match_labels": {OWNER_LABEL: self.prefix},
            "match_expressions": [{"key": "nodeagent.io/stability", "operator": "Exists"}],
        }

    def delete_all(self) -> None:
        """Delete every node this set created."""
        core = client.CoreV1Api(self.api)
        for name in self.names:
            try:
                core.delete_node(name)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        self.names.clear()
