"""Fixtures: a cluster on the real control plane, the tiering service's identity, a fake clock
and a controller factory.

The service runs under the deploy manifests' ``nodeagent-tiering`` ServiceAccount; its tier
policy manages exactly this test's nodes (``NodeSet.selector``), and its Lease is named after
the test. Other clients' writes (the agents' labels and conditions, pods, budgets) go in as the
admin, the way the agents, users and controllers would make them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client

from nodeagent import labels as lbl
from nodeagent.testing.clock import FakeClock
from nodeagent.testing.kube import waiting
from nodeagent.testing.kube.controlplane import AuditedRequest, ControlPlane
from nodeagent.testing.kube.deploy import Identities, Identity
from nodeagent.testing.kube.nodes import KubeletStandIn, NodeSet, pod_manifest
from nodeagent_tiering.cluster.cluster_api import Kube, api_client
from nodeagent_tiering.cluster.informer import NodeCache
from nodeagent_tiering.cluster.tier_policy import TierPolicy, parse_policy
from nodeagent_tiering.drain.controller import Controller
from nodeagent_tiering.drain.leader import LeaderElector, LeaseTiming

JSON = dict[str, Any]
LEASE_NAMESPACE = "nodeagent"  # the service's namespace in the deploy manifests

POLICY: dict[str, Any] = {
    "version": "v1",
    "tiers": [
        {
            "name": "training",
            "selector": {
                "match_labels": {lbl.GPU_COUNT: "8", lbl.NVLINK_LARGEST_SET: "8"},
                "match_expressions": [
                    {
                        "key": lbl.GPU_PRODUCT,
                        "operator": "In",
                        "values": ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H200"],
                    }
                ],
            },
            "stability": ["stable"],
            "min_healthy": 1,
            "max_draining": 1,
        },
        {"name": "general", "selector": {"match_labels": {lbl.GPU_COUNT: "8"}}},
        {"name": "shared", "min_healthy": 0, "max_draining": "50%"},
    ],
    "recovery_period_s": 600,
    "budget": {"max_draining": 2, "cooldown_s": 0},
    "breaker": {"percentage": 50, "window_s": 300, "min_unstable": 2},
}


def gpu_labels(
    product: str = "NVIDIA-H100-80GB-HBM3",
    count: int = 8,
    nvlink: int = 8,
    stability: str = "stable",
) -> dict[str, str]:
    """Labels an agent publishes on a GPU node."""
    return {
        lbl.GPU_PRODUCT: product,
        lbl.GPU_COUNT: str(count),
        lbl.NVLINK_LARGEST_SET: str(nvlink),
        lbl.STABILITY: stability,
        lbl.GPU_HEALTH: "healthy" if stability != "unstable" else "unhealthy",
        lbl.POOL: "default",
        lbl.DRIVER_VERSION: "550.54.15",
    }


@dataclass(eq=False)
class Cluster:
    """This test's nodes, pods and budgets, and what the service asked of the API server."""

    plane: ControlPlane
    nodes: NodeSet
    namespace: str
    identity: Identity
    kubelets: KubeletStandIn | None

    def __post_init__(self) -> None:
        self.api = self.plane.api_client()
        self.core = client.CoreV1Api(self.api)
        self.lease_name = f"tiering-{self.namespace}"[:63]
        self.mark = self.plane.audit_mark()

    # the service's side

    def policy_data(self, base: Mapping[str, Any] = POLICY, **changes: Any) -> dict[str, Any]:
        """A tier policy that manages exactly this test's nodes."""
        return {**base, "nodes": self.nodes.selector(), **changes}

    def policy(self, base: Mapping[str, Any] = POLICY, **changes: Any) -> TierPolicy:
        return parse_policy(self.policy_data(base, **changes))

    def kube(self) -> Kube:
        """A client as the tiering service, under its ServiceAccount."""
        return Kube(api_client(kubeconfig=self.identity.kubeconfig.path))

    def requests(self, user: str | None = None) -> list[AuditedRequest]:
        """The service's requests since the test began."""
        return self.plane.audited(self.mark, user=user or self.identity.user)

    def calls(self, verb: str, resource: str) -> list[tuple[str, int]]:
        """(object name, response code) of the service's ``verb`` ``resource`` requests."""
        return [
            (r.name, r.code) for r in self.requests() if (r.verb, r.resource) == (verb, resource)
        ]

    # nodes

    def add_nodes(self, spec: Mapping[str, Mapping[str, str]], *, gpus: int = 8) -> None:
        """Create Ready nodes from a suffix -> labels mapping."""
        for suffix, labels in spec.items():
            self.nodes.create(suffix, labels, gpus=gpus)

    def node(self, suffix: str) -> JSON:
        return self.nodes.get(suffix)

    def tier_of(self, suffix: str) -> str | None:
        return self.node(suffix)["metadata"].get("labels", {}).get(lbl.TIER)

    def set_labels(self, suffix: str, labels: Mapping[str, str | None]) -> None:
        """Labels as an agent sets them."""
        self.nodes.patch(suffix, {"metadata": {"labels": dict(labels)}})

    def set_stability(self, suffix: str, stability: str) -> None:
        self.set_labels(suffix, {lbl.STABILITY: stability})

    def set_gpu_condition(self, suffix: str, status: str, reason: str, message: str = "") -> None:
        """The agent's GPUHealthy condition, merged by type as the agent sends it."""
        condition = {"type": lbl.GPU_HEALTHY_CONDITION, "status": status, "reason": reason,
                     "message": message}  # fmt: skip
        self.core.patch_node_status(
            self.nodes.name(suffix),
            {"status": {"conditions": [condition]}},
            _content_type="application/strategic-merge-patch+json",
        )

    # pods, budgets, daemons

    def add_pod(
        self,
        name: str,
        node: str,
        *,
        labels: Mapping[str, str] | None = None,
        grace_s: int | None = None,
        namespace: str | None = None,
        annotations: Mapping[str, str] | None = None,
        owner: JSON | None = None,
    ) -> None:
        """A pod bound to node ``node`` (a suffix), as the scheduler would have bound it."""
        pod = pod_manifest(
            name, node_name=self.nodes.name(node), labels=labels, annotations=annotations
        )
        if grace_s is not None:
            pod["spec"]["terminationGracePeriodSeconds"] = grace_s
        if owner is not None:
            pod["metadata"]["ownerReferences"] = [owner]
        self.core.create_namespaced_pod(namespace or self.namespace, pod)

    def add_mirror_pod(self, name: str, node: str) -> None:
        """A static pod's mirror in kube-system, owned by its node, as a kubelet creates it."""
        uid = self.node(node)["metadata"]["uid"]
        owner = {"apiVersion": "v1", "kind": "Node", "name": self.nodes.name(node), "uid": uid,
                 "controller": True}  # fmt: skip
        self.add_pod(
            name,
            node,
            namespace="kube-system",
            annotations={"kubernetes.io/config.mirror": "harness"},
            owner=owner,
        )

    def add_daemonset(self, name: str, node: str) -> str:
        """A DaemonSet that runs on node ``node`` only; returns its pod's name once running."""
        marker = {"test.nodeagent.io/daemon": name}
        self.set_labels(node, marker)
        template = pod_manifest(name, labels={"app": name})
        body = {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": name},
            "spec": {
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": template["metadata"],
                    "spec": {**template["spec"], "nodeSelector": marker},
                },
            },
        }
        client.AppsV1Api(self.api).create_namespaced_daemon_set(self.namespace, body)

        def running(pods: dict[str, JSON]) -> str | None:
            for pod_name, pod in pods.items():
                if pod_name.startswith(f"{name}-") and pod["status"].get("phase") == "Running":
                    return pod_name
            return None

        return waiting.pods(
            self.api, self.namespace, running, what=f"DaemonSet {name}: its pod running"
        )

    def add_pdb(
        self,
        name: str,
        selector: Mapping[str, str],
        *,
        min_available: int | None = None,
        max_unavailable: int | None = None,
        healthy: int,
    ) -> None:
        """A PodDisruptionBudget; returns once the disruption controller counted ``healthy``
        pods for it (before that the API server refuses every eviction it covers)."""
        spec: JSON = {"selector": {"matchLabels": dict(selector)}}
        if min_available is not None:
            spec["minAvailable"] = min_available
        if max_unavailable is not None:
            spec["maxUnavailable"] = max_unavailable
        policy = client.PolicyV1Api(self.api)
        policy.create_namespaced_pod_disruption_budget(
            self.namespace, {"metadata": {"name": name}, "spec": spec}
        )
        self.wait_pdb(name, healthy)

    def wait_pdb(self, name: str, healthy: int) -> JSON:
        """The budget once its status counts ``healthy`` pods."""
        policy = client.PolicyV1Api(self.api)

        def counted(objects: dict[str, JSON]) -> JSON | None:
            pdb = objects.get(f"{self.namespace}/{name}")
            status = (pdb or {}).get("status") or {}
            if pdb and status.get("observedGeneration") == pdb["metadata"]["generation"]:
                return pdb if status.get("currentHealthy") == healthy else None
            return None

        return waiting.until(
            policy.list_namespaced_pod_disruption_budget,
            counted,
            what=f"disruption controller: PodDisruptionBudget {name} counting {healthy} pods",
            namespace=self.namespace,
        )

    def pods(self, namespace: str | None = None) -> set[str]:
        """Names of the pods that exist now."""
        listed = self.core.list_namespaced_pod(namespace or self.namespace)
        return {p.metadata.name for p in listed.items}

    def wait_pods(self, predicate: Callable[[set[str]], bool], what: str) -> None:
        """Until ``predicate(names of the pods not terminating)`` holds."""

        def check(pods: dict[str, JSON]) -> bool:
            return predicate(
                {n for n, p in pods.items() if not p["metadata"].get("deletionTimestamp")}
            )

        waiting.pods(self.api, self.namespace, check, what=what)

    def wait_running(self, *names: str) -> None:
        def check(pods: dict[str, JSON]) -> bool:
            return all(
                (pods.get(n) or {}).get("status", {}).get("phase") == "Running" for n in names
            )

        waiting.pods(
            self.api, self.namespace, check, what=f"kubelet stand-in: pods {names} Running"
        )

    def wait_gone(self, *names: str) -> None:
        def check(pods: dict[str, JSON]) -> bool:
            return not set(names) & set(pods)

        waiting.pods(
            self.api, self.namespace, check, what=f"kubelet stand-in: pods {names} deleted"
        )

    # events and the lease

    def events(self, node: str) -> list[JSON]:
        """Events about node ``node`` (a suffix), oldest first."""
        listed = json.loads(
            self.core.list_namespaced_event(
                "default",
                field_selector=f"involvedObject.name={self.nodes.name(node)}",
                _preload_content=False,
            ).data
        )
        return sorted(listed["items"], key=lambda e: int(e["metadata"]["resourceVersion"]))

    def reasons(self, node: str) -> list[str]:
        return [e["reason"] for e in self.events(node)]

    def lease(self) -> JSON:
        coordination = client.CoordinationV1Api(self.api)
        resp: Any = coordination.read_namespaced_lease(
            self.lease_name, LEASE_NAMESPACE, _preload_content=False
        )
        lease: JSON = json.loads(resp.data)
        return lease

    def delete_lease(self) -> None:
        coordination = client.CoordinationV1Api(self.api)
        try:
            coordination.delete_namespaced_lease(self.lease_name, LEASE_NAMESPACE)
        except client.ApiException as exc:
            if exc.status != 404:
                raise


@pytest.fixture
def cluster(
    control_plane: ControlPlane,
    kube_nodes: NodeSet,
    kube_ns: str,
    kube_identities: Identities,
    kubelets: KubeletStandIn,
) -> Any:
    made = Cluster(control_plane, kube_nodes, kube_ns, kube_identities.tiering, kubelets)
    yield made
    made.delete_lease()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def policy(cluster: Cluster) -> TierPolicy:
    return cluster.policy()


@pytest.fixture
def make_controller(
    cluster: Cluster, clock: FakeClock, policy: TierPolicy
) -> Callable[..., Controller]:
    """Factory: a controller as the tiering service; ``elect=True`` adds a leader elector."""

    def make(
        *,
        dry_run: bool = False,
        elect: bool = False,
        identity: str = "replica-a",
        pol: TierPolicy | None = None,
    ) -> Controller:
        kube = cluster.kube()
        cache = NodeCache(kube)
        cache.relist()
        elector = None
        if elect:
            elector = LeaderElector(
                kube,
                namespace=LEASE_NAMESPACE,
                name=cluster.lease_name,
                identity=identity,
                clock=clock,
                timing=LeaseTiming(15, 10, 2),
            )
        return Controller(kube, cache, pol or policy, clock=clock, elector=elector, dry_run=dry_run)

    return make
