"""Fixtures of the quota tests: the real control plane with Kueue, and per-test tiers, teams,
namespaces and GPU nodes whose names cannot collide with another test's.

ResourceFlavors, ClusterQueues and Cohorts are cluster-scoped and the control plane lives for
the whole test run, so every name a test makes carries the test's own suffix (``env.uid``);
:class:`KueueEnv` deletes what the test made when it ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pytest
import yaml
from kubernetes import client

from nodeagent import labels as lbl
from nodeagent.testing.kube.controlplane import ControlPlane
from nodeagent.testing.kube.nodes import create_node, pod_manifest
from nodeagent.testing.waiting import wait_until
from nodeagent_tiering.cluster import kueue
from nodeagent_tiering.cluster.cluster_api import Kube
from nodeagent_tiering.quota.policy import QuotaPolicy, parse_quota_policy

JSON = dict[str, Any]


def wait_for(predicate: Callable[[], Any], timeout_s: float = 60.0, what: str = "it") -> Any:
    """Poll until ``predicate`` returns something truthy; that value."""
    seen: list[Any] = []
    if not wait_until(lambda: bool(seen.append(predicate()) or seen[-1]), timeout_s, 0.1):
        raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
    return seen[-1]


class KueueEnv:
    """One test's corner of the shared control plane."""

    def __init__(self, plane: ControlPlane, kube_ns: str) -> None:
        self.plane = plane
        self.ns = kube_ns
        self.uid = kube_ns.rsplit("-", 1)[-1]
        self.api_client = plane.api_client()
        self.kube = Kube(self.api_client)
        self.core = client.CoreV1Api(self.api_client)
        self.custom = client.CustomObjectsApi(self.api_client)
        api = self.kube.kueue_api()
        assert api is not None, "the harness serves Kueue"
        self.api = api
        self._namespaces: list[str] = []
        self._nodes: list[str] = []

    def name(self, base: str) -> str:
        """``base`` made unique to this test."""
        return f"{base}-{self.uid}"

    def namespace(self, base: str) -> str:
        """A namespace of this test's own."""
        name = self.name(base)
        self.plane.create_namespace(name)
        self._namespaces.append(name)
        return name

    def node(
        self,
        base: str,
        tier: str | None,
        *,
        gpus: int = 8,
        capacity: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        taints: Sequence[Mapping[str, str]] = (),
        unschedulable: bool = False,
        annotations: Mapping[str, str] | None = None,
    ) -> str:
        """A Ready kubelet-less GPU node in ``tier`` (labelled as the tiering service does)."""
        name = self.name(base)
        all_labels = {lbl.STABILITY: "stable", **(labels or {})}
        if tier is not None:
            all_labels[lbl.TIER] = tier
        create_node(
            self.api_client,
            name,
            all_labels,
            gpus=gpus,
            capacity=capacity,
            taints=taints,
            unschedulable=unschedulable,
            annotations=annotations,
        )
        self._nodes.append(name)
        return name

    def pod(
        self, namespace: str, name: str, *, gpus: int = 0, queue: str | None = None, **kw: Any
    ) -> None:
        """A pod submitted to a LocalQueue (label ``kueue.x-k8s.io/queue-name``)."""
        labels = dict(kw.pop("labels", {}) or {})
        if queue is not None:
            labels[lbl.KUEUE_QUEUE_NAME] = queue
        self.core.create_namespaced_pod(
            namespace, pod_manifest(name, gpus=gpus, labels=labels, **kw)
        )

    def workloads(self, namespace: str) -> dict[str, JSON]:
        """The namespace's Workloads by the name of the pod that owns each."""
        items = self.custom.list_namespaced_custom_object(
            kueue.GROUP, self.api.version, namespace, "workloads"
        )["items"]
        return {w["metadata"]["ownerReferences"][0]["name"]: w for w in items}

    def cluster_queue(self, name: str) -> JSON:
        """A ClusterQueue as the API server holds it."""
        result: JSON = self.custom.get_cluster_custom_object(
            kueue.GROUP, self.api.version, "clusterqueues", name
        )
        return result

    def foreign_cluster_queue(self, base: str, flavor: str, gpus: int) -> JSON:
        """A ClusterQueue someone else made (no nodeagent labels) promising ``gpus``
        ``nvidia.com/gpu`` on ``flavor``, to apply."""
        return {
            "apiVersion": self.api.api_version,
            "kind": "ClusterQueue",
            "metadata": {"name": self.name(base)},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["nvidia.com/gpu"],
                        "flavors": [
                            {
                                "name": flavor,
                                "resources": [{"name": "nvidia.com/gpu", "nominalQuota": gpus}],
                            }
                        ],
                    }
                ],
            },
        }

    def edit(self, plural: str, name: str, path: Sequence[str | int], value: Any) -> None:
        """Change one field of a cluster-scoped Kueue object by hand, as `kubectl edit` would
        (field manager ``kubectl-edit``; a JSON patch, so Kueue's own concurrent status and
        finalizer writes do not make it fail)."""
        pointer = "/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in path)
        self.custom.patch_cluster_custom_object(
            kueue.GROUP,
            self.api.version,
            plural,
            name,
            [{"op": "replace", "path": pointer, "value": value}],
            field_manager="kubectl-edit",
            _content_type="application/json-patch+json",
        )

    def close(self) -> None:
        for name in self._nodes:
            with contextlib.suppress(client.ApiException):
                self.core.delete_node(name)
        for name in self._namespaces:
            self.plane.delete_namespace(name)
        # Cluster-scoped Kueue objects carrying this test's suffix (queues first: a flavor
        # stays while a queue names it, Kueue's finalizer sees to that).
        for plural in ("clusterqueues", "cohorts", "resourceflavors"):
            items = self.custom.list_cluster_custom_object(kueue.GROUP, self.api.version, plural)[
                "items"
            ]
            names = [o["metadata"]["name"] for o in items if self.uid in o["metadata"]["name"]]
            if names:
                self.plane.kubectl(
                    "delete", f"{plural}.{kueue.GROUP}", *names, "--wait=false", check=False
                )
        # The request templates' admission policies and bindings (cluster-scoped too).
        admission = client.AdmissionregistrationV1Api(self.api_client)
        for binding in admission.list_validating_admission_policy_binding().items:
            if self.uid in binding.metadata.name:
                admission.delete_validating_admission_policy_binding(binding.metadata.name)
        for policy in admission.list_validating_admission_policy().items:
            if self.uid in policy.metadata.name:
                admission.delete_validating_admission_policy(policy.metadata.name)


@pytest.fixture
def env(control_plane: ControlPlane, kube_ns: str, kubelets: Any) -> Iterator[KueueEnv]:
    """This test's corner of the control plane (Kueue, scheduler, the kubelet stand-in)."""
    e = KueueEnv(control_plane, kube_ns)
    yield e
    e.close()


def quota_policy(data: Mapping[str, Any], tiers: Sequence[str] | None = None) -> QuotaPolicy:
    """A quota policy from a mapping (through the same loader as files)."""
    return parse_quota_policy(yaml.safe_dump(dict(data)), tiers=tiers)


def condition(obj: Mapping[str, Any], kind: str) -> str | None:
    """The status of a condition, or ``None``."""
    for c in (obj.get("status") or {}).get("conditions") or ():
        if c.get("type") == kind:
            return str(c.get("status"))
    return None
