"""The control-plane harness itself: what every kube test relies on holds on the real programs."""

from __future__ import annotations

import functools
import json

import pytest
import urllib3
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from nodeagent.testing.kube import waiting
from nodeagent.testing.kube.controlplane import ControlPlane, bins_dir
from nodeagent.testing.kube.nodes import NodeSet, create_node, pod_manifest


def phase(name: str, value: str):
    """A pods predicate: pod ``name`` in phase ``value`` (returns the pod)."""
    return lambda pods: (
        pods.get(name) if (pods.get(name) or {}).get("status", {}).get("phase") == value else None
    )


def test_starts_without_kueue_in_under_15_s():
    with ControlPlane(bins=bins_dir()) as plane:
        assert plane.started_s < 15, plane.started_s
        assert plane.request("GET", "/readyz") == "ok"
    assert not any(c.running for c in plane.components.values())


@pytest.fixture
def core(control_plane: ControlPlane) -> client.CoreV1Api:
    return client.CoreV1Api(control_plane.api_client())


def test_scheduler_binds_gpu_pods_to_kubeletless_nodes_and_they_run(
    control_plane, kube_ns, kubelets, core
):
    node = f"{kube_ns}-n1"
    create_node(control_plane.api_client(), node, {"pool": kube_ns}, gpus=8)
    try:
        core.create_namespaced_pod(
            kube_ns, pod_manifest("fits", gpus=4, node_selector={"pool": kube_ns})
        )
        core.create_namespaced_pod(
            kube_ns, pod_manifest("too-big", gpus=9, node_selector={"pool": kube_ns})
        )
        api = control_plane.api_client()
        fits = waiting.pods(
            api,
            kube_ns,
            phase("fits", "Running"),
            what="scheduler and kubelet stand-in: fits Running",
        )
        assert fits["spec"]["nodeName"] == node

        def unschedulable(pods):
            cond = waiting.condition(pods.get("too-big") or {}, "PodScheduled") or {}
            return (
                cond
                if (cond.get("status"), cond.get("reason")) == ("False", "Unschedulable")
                else None
            )

        cond = waiting.pods(api, kube_ns, unschedulable, what="scheduler: too-big Unschedulable")
        assert "Insufficient nvidia.com/gpu" in cond["message"]
    finally:
        core.delete_node(node)


def test_eviction_honours_a_real_pdb_and_deletion_completes(control_plane, kube_ns, kubelets, core):
    node = f"{kube_ns}-n1"
    create_node(control_plane.api_client(), node, gpus=8)
    try:
        for name in ("a", "b"):
            core.create_namespaced_pod(
                kube_ns, pod_manifest(name, node_name=node, labels={"app": "w"})
            )
        client.PolicyV1Api(control_plane.api_client()).create_namespaced_pod_disruption_budget(
            kube_ns,
            {
                "metadata": {"name": "w"},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "w"}}},
            },
        )
        policy = client.PolicyV1Api(control_plane.api_client())
        waiting.until(
            policy.list_namespaced_pod_disruption_budget,
            lambda pdbs: (
                (pdbs.get(f"{kube_ns}/w") or {}).get("status", {}).get("disruptionsAllowed") == 1
            ),
            what="disruption controller: PodDisruptionBudget w allowing one disruption",
            namespace=kube_ns,
        )
        eviction = {"metadata": {"name": "a", "namespace": kube_ns}}
        core.create_namespaced_pod_eviction("a", kube_ns, eviction)
        waiting.pods(
            control_plane.api_client(),
            kube_ns,
            lambda pods: "a" not in pods,
            what="kubelet stand-in: evicted pod a deleted",
        )
        with pytest.raises(ApiException) as blocked:
            core.create_namespaced_pod_eviction(
                "b", kube_ns, {"metadata": {"name": "b", "namespace": kube_ns}}
            )
        assert blocked.value.status == 429
    finally:
        core.delete_node(node)


def test_node_watch_from_before_a_compaction_ends_with_410(private_control_plane):
    """With the API server's watch cache on, a client gets 410 once its version leaves the
    cache's window; with it off for nodes (the private control plane), the compaction alone
    does it (what etcd says)."""
    plane = private_control_plane
    api = plane.api_client()
    core = client.CoreV1Api(api)
    nodes = NodeSet(api, "compaction")
    try:
        old = core.list_node().metadata.resource_version
        for i in range(3):
            nodes.create(f"n{i}")
        plane.compact_etcd()
        with pytest.raises(ApiException) as gone:
            for _event in watch.Watch().stream(
                core.list_node, resource_version=old, timeout_seconds=5
            ):
                pass
        assert gone.value.status == 410
    finally:
        nodes.delete_all()


def test_a_service_account_without_a_role_is_forbidden(control_plane, kube_ns):
    kubeconfig = control_plane.service_account_kubeconfig(kube_ns, "nobody")
    core = client.CoreV1Api(control_plane.api_client(kubeconfig))
    with pytest.raises(ApiException) as denied:
        core.list_node()
    assert denied.value.status == 403
    assert f"system:serviceaccount:{kube_ns}:nobody" in json.loads(denied.value.body)["message"]


def test_the_audit_log_counts_a_service_accounts_requests(control_plane, kube_ns):
    kubeconfig = control_plane.service_account_kubeconfig(kube_ns, "counted")
    core = client.CoreV1Api(control_plane.api_client(kubeconfig))
    mark = control_plane.audit_mark()
    for _ in range(3):
        with pytest.raises(ApiException):
            core.read_namespaced_config_map("absent", kube_ns)
    user = f"system:serviceaccount:{kube_ns}:counted"
    seen = control_plane.audited(mark, user=user)
    assert [(r.verb, r.resource, r.name, r.code) for r in seen] == [
        ("get", "configmaps", "absent", 403)
    ] * 3
    assert control_plane.audited(control_plane.audit_mark(), user=user) == []


def test_api_server_restart_keeps_the_store_and_the_port(control_plane, kube_ns, core):
    core.create_namespaced_config_map(kube_ns, {"metadata": {"name": "kept"}})
    port = control_plane.apiserver_port
    control_plane.stop_apiserver()
    with pytest.raises(urllib3.exceptions.HTTPError):  # connection refused, retries exhausted
        core.read_namespaced_config_map("kept", kube_ns, _request_timeout=2)
    control_plane.start_apiserver()
    assert control_plane.apiserver_port == port
    assert core.read_namespaced_config_map("kept", kube_ns).metadata.name == "kept"


def test_kueue_admits_a_workload_within_quota(control_plane, kube_ns, kubelets, core):
    rf = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": f"{kube_ns}-rf"},
    }
    cq = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": f"{kube_ns}-cq"},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["nvidia.com/gpu"],
                    "flavors": [
                        {
                            "name": f"{kube_ns}-rf",
                            "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 4}],
                        }
                    ],
                }
            ],
        },
    }
    lq = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": "q", "namespace": kube_ns},
        "spec": {"clusterQueue": f"{kube_ns}-cq"},
    }
    control_plane.apply([rf, cq, lq])
    node = f"{kube_ns}-n1"
    create_node(control_plane.api_client(), node, gpus=8)
    try:
        for name, gpus in (("small", 2), ("large", 8)):
            core.create_namespaced_pod(
                kube_ns,
                pod_manifest(name, gpus=gpus, labels={"kueue.x-k8s.io/queue-name": "q"}),
            )
        custom = client.CustomObjectsApi(control_plane.api_client())

        def workloads(objects):
            out = {}
            for wl in objects.values():
                owner = wl["metadata"]["ownerReferences"][0]["name"]
                conds = {c["type"]: c["status"] for c in wl.get("status", {}).get("conditions", [])}
                out[owner] = conds.get("QuotaReserved")
            return out if out.get("small") == "True" and out.get("large") else None

        states = waiting.until(
            functools.partial(
                custom.list_namespaced_custom_object,
                "kueue.x-k8s.io",
                "v1beta2",
                kube_ns,
                "workloads",
            ),
            workloads,
            what="Kueue: the small workload admitted",
        )
        assert states == {"small": "True", "large": "False"}
        waiting.pods(
            control_plane.api_client(),
            kube_ns,
            phase("small", "Running"),
            what="kubelet stand-in: the admitted pod small Running",
        )
    finally:
        core.delete_node(node)
        control_plane.kubectl("delete", "clusterqueue", f"{kube_ns}-cq", "--wait=false")
        control_plane.kubectl("delete", "resourceflavor", f"{kube_ns}-rf", "--wait=false")
