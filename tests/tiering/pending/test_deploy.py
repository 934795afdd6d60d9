"""The diagnosis under the shipped least-privilege RBAC (its rules and dashboard:
tests/tiering/test_monitoring.py)."""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client
from prometheus_client import CollectorRegistry

from nodeagent.agent.mig_planning import plan_for_diagnosis
from nodeagent.testing.clock import FakeClock
from nodeagent.testing.kube.controlplane import ControlPlane
from nodeagent.testing.waiting import wait_until
from nodeagent_tiering.cluster.cluster_api import Kube, KubeError
from nodeagent_tiering.cluster.informer import NodeCache
from nodeagent_tiering.pending.loop import PendingLoop
from nodeagent_tiering.pending.metrics import PendingMetrics
from nodeagent_tiering.pending.results import Settings
from tests.deploy.tools import KUSTOMIZE_DIR, kustomize


def rbac_objects() -> list[dict[str, Any]]:
    """The service's roles and bindings (one set for tiers, drains and the diagnosis)."""
    return [
        o
        for o in kustomize(KUSTOMIZE_DIR / "tiering")
        if o["kind"] in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
    ]


def test_the_service_reads_pods_and_only_evicts_them() -> None:
    objects = rbac_objects()
    verbs = {
        (g, r, v)
        for o in objects
        if o["kind"] in ("ClusterRole", "Role")
        for rule in o["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert {v for g, r, v in verbs if r == "pods"} == {"list", "watch"}
    assert {(r, v) for _, r, v in verbs if r.startswith("pods/")} == {("pods/eviction", "create")}


def _retarget(objects: list[dict[str, Any]], ns: str, suffix: str) -> list[dict[str, Any]]:
    """The manifests for a service account in the test's namespace (unique cluster names)."""
    out = json.loads(json.dumps(objects))
    for o in out:
        meta = o["metadata"]
        if o["kind"].startswith("Cluster"):
            meta["name"] += suffix
        else:
            meta["namespace"] = ns
        if "roleRef" in o and o["roleRef"]["kind"] == "ClusterRole":
            o["roleRef"]["name"] += suffix
        for s in o.get("subjects", []):
            s["namespace"] = ns
    return out


def test_a_leader_pass_needs_nothing_more_than_the_shipped_rbac(
    control_plane: ControlPlane, kube_ns: str
) -> None:
    rbac = rbac_objects()
    suffix = f"-{kube_ns[-5:]}"
    control_plane.apply(_retarget(rbac, kube_ns, suffix))
    kubeconfig = control_plane.service_account_kubeconfig(kube_ns, "nodeagent-tiering")
    kube = Kube(control_plane.api_client(kubeconfig))

    def granted() -> bool:
        # RBAC reaches the authorizer through an informer: new bindings apply a moment later.
        try:
            kube.list_component_events("probe")
            kube.get_config_map(kube_ns, "nodeagent-tiering-history")
        except KubeError as exc:
            if exc.status == 403:
                return False
            raise
        return True

    assert wait_until(granted, 30, 0.2)
    loop = PendingLoop(
        kube,
        NodeCache(kube),
        Settings(),
        PendingMetrics(CollectorRegistry()),
        plan_for_diagnosis,
        clock=FakeClock(),
        namespace=kube_ns,
        identity="replica-1",
        may_act=lambda: True,
    )
    mark = control_plane.audit_mark()
    loop.nodes.relist()
    loop.pods.relist()
    loop.workloads.relist()
    loop.local_queues.relist()
    loop.cluster_queues.relist()
    loop.pass_once()
    loop.store.save(loop.history, 1.0)  # a second save replaces the ConfigMap
    user = f"system:serviceaccount:{kube_ns}:nodeagent-tiering"
    calls = control_plane.audited(mark, user=user)
    assert calls, "the audit log saw none of the service's requests"
    core = client.CoreV1Api(control_plane.api_client())
    live = {n.metadata.name for n in core.list_namespace().items if n.status.phase == "Active"}

    def terminating(uri: str) -> bool:
        # Other tests' namespaces being deleted refuse new Events with a 403 of their own.
        parts = uri.split("/")
        return "namespaces" in parts and parts[parts.index("namespaces") + 1] not in live

    assert [c for c in calls if c.code == 403 and not terminating(c.uri)] == []
    for name in ("ClusterRole", "ClusterRoleBinding"):
        for o in _retarget(rbac, kube_ns, suffix):
            if o["kind"] == name:
                control_plane.kubectl("delete", name.lower(), o["metadata"]["name"], "--wait=false")
