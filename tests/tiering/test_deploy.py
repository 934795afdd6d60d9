"""The tiering manifests: schema-valid, accepted by the real API server, least-privilege RBAC that
binds, and args the CLI accepts."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from nodeagent.cli.tiering import app
from nodeagent.testing.kube import waiting
from nodeagent.testing.kube.deploy import (
    kubectl_apply,
    kubectl_delete,
    rbac_objects,
    render,
    wait_bound,
)
from nodeagent_tiering.cluster.tier_policy import parse_policy
from tests.deploy.tools import KUSTOMIZE_DIR, kustomize, object_key, require_module

DIRECTORY = KUSTOMIZE_DIR / "tiering"


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return kustomize(DIRECTORY)


def one(objects, kind):
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def test_every_object_is_schema_valid(objects):
    require_module("kubernetes_validate")
    import kubernetes_validate

    for obj in objects:
        kubernetes_validate.validate(obj, "1.35.0", strict=True)


def test_rbac_is_exactly_what_the_service_calls(objects):
    # What the service asks for at run time is compared with these rules on the real API
    # server (test_leader.test_two_service_processes_one_leader_and_failover_after_kill_9).
    def rules(kind, namespace=None):
        return {
            (g, r, v)
            for role in objects
            if role["kind"] == kind and role["metadata"].get("namespace") == namespace
            for rule in role["rules"]
            for g in rule["apiGroups"]
            for r in rule["resources"]
            for v in rule["verbs"]
        }

    assert rules("ClusterRole") == {
        ("", "nodes", "list"), ("", "nodes", "watch"), ("", "nodes", "patch"),
        ("", "pods", "list"), ("", "pods", "watch"), ("", "pods/eviction", "create"),
        # the diagnosis's Events on pending pods, read back after a restart
        ("", "events", "list"), ("", "events", "create"), ("", "events", "patch"),
        ("kueue.x-k8s.io", "workloads", "list"), ("kueue.x-k8s.io", "workloads", "watch"),
        ("kueue.x-k8s.io", "resourceflavors", "list"),
        ("kueue.x-k8s.io", "resourceflavors", "create"),
        ("kueue.x-k8s.io", "resourceflavors", "patch"),
        ("kueue.x-k8s.io", "resourceflavors", "delete"),
        # the ClusterQueues' quota and the LocalQueues' ClusterQueue: why a job waits
        ("kueue.x-k8s.io", "clusterqueues", "list"),
        ("kueue.x-k8s.io", "clusterqueues", "watch"),
        ("kueue.x-k8s.io", "localqueues", "list"), ("kueue.x-k8s.io", "localqueues", "watch"),
    }  # fmt: skip
    assert rules("Role", "nodeagent") == {
        ("coordination.k8s.io", "leases", "get"),
        ("coordination.k8s.io", "leases", "create"),
        ("coordination.k8s.io", "leases", "update"),
        ("", "events", "create"),  # about the Lease (the circuit breaker)
        ("", "configmaps", "create"),  # the fragmentation history, once
        ("", "configmaps", "get"),  # and then only that one (resourceNames)
        ("", "configmaps", "update"),
    }
    history = [
        rule
        for role in objects
        if role["kind"] == "Role" and role["metadata"].get("namespace") == "nodeagent"
        for rule in role["rules"]
        if {"get", "update"} & set(rule["verbs"]) and rule["resources"] == ["configmaps"]
    ]
    assert [r.get("resourceNames") for r in history] == [["nodeagent-tiering-history"]]
    # Events about nodes: the API server keeps them in `default`.
    assert rules("Role", "default") == {("", "events", "create")}
    account = one(objects, "ServiceAccount")["metadata"]
    bindings = [o for o in objects if o["kind"] in ("ClusterRoleBinding", "RoleBinding")]
    assert len(bindings) == 3
    for binding in bindings:
        (subject,) = binding["subjects"]
        assert (subject["name"], subject["namespace"]) == (account["name"], account["namespace"])


def test_manifests_are_accepted_by_the_api_server_and_bind(control_plane, kube_identities):
    """``kubectl apply --dry-run=server``, then for real: the Deployment's ReplicaSet creates
    both pods (they pass admission; with no kubelets they never run), the roles bind."""
    objects = render(control_plane, DIRECTORY)
    answered = kubectl_apply(control_plane, objects, dry_run=True)
    assert [object_key(o) for o in answered] == [object_key(o) for o in objects]
    workloads = [
        o for o in objects if o["kind"] in ("Deployment", "ConfigMap", "PodDisruptionBudget")
    ]
    try:
        kubectl_apply(control_plane, objects)

        def both(pods):
            mine = [
                p for p in pods.values() if p["metadata"]["name"].startswith("nodeagent-tiering-")
            ]
            return mine if len(mine) == 2 else None

        pods = waiting.pods(
            control_plane.api_client(),
            "nodeagent",
            both,
            what="Deployment nodeagent-tiering: its ReplicaSet creating 2 pods",
        )
        assert {p["spec"]["serviceAccountName"] for p in pods} == {kube_identities.tiering.name}
        wait_bound(control_plane, kube_identities.tiering.user, rbac_objects(objects))
    finally:
        kubectl_delete(control_plane, workloads)


def test_deployment_runs_two_electing_replicas_with_the_shipped_policy(objects):
    deployment = one(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == one(objects, "ServiceAccount")["metadata"]["name"]
    (container,) = pod["containers"]
    args = container["args"]
    assert args[:2] == ["tiering", "run"]
    assert "--in-cluster" in args
    policy_text = one(objects, "ConfigMap")["data"]["policy.yaml"]
    policy = parse_policy(yaml.safe_load(policy_text))
    assert [t.name for t in policy.tiers] == ["training", "general", "shared"]
    # The CLI accepts every flag the manifest passes (checked with --help after them).
    result = CliRunner().invoke(app, [*args[1:], "--help"])
    assert result.exit_code == 0, result.output
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
