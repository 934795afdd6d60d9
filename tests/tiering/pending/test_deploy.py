"""What ships for the diagnosis: rules (promtool), the dashboard, least-privilege RBAC."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from prometheus_client import CollectorRegistry

from nodeagent.agent.mig_planning import plan_for_diagnosis
from nodeagent.testing.clock import FakeClock
from nodeagent.testing.kube.controlplane import ControlPlane
from nodeagent.testing.waiting import wait_until
from nodeagent_tiering.kube import Kube, KubeError, NodeCache
from nodeagent_tiering.metrics import TieringMetrics
from nodeagent_tiering.pending import Settings
from nodeagent_tiering.pending_loop import PendingLoop
from tests.deploy.tools import KUSTOMIZE_DIR, kustomize, require_module, require_tool

REPO = Path(__file__).resolve().parents[3]
RULES = REPO / "deploy" / "prometheus" / "nodeagent-tiering-rules.yaml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "tests" / "nodeagent-tiering-rules.test.yaml"
DASHBOARD = REPO / "deploy" / "grafana" / "nodeagent-tiering-pending.json"
METRIC = re.compile(r"(?<![:\w])(nodeagent_[a-z0-9_]+)")
RECORDED = re.compile(r"\b([a-z_]+:nodeagent_tiering_[a-z0-9_]+:[a-z0-9_]+)")


def registered() -> set[str]:
    names = set()
    for family in TieringMetrics(CollectorRegistry()).registry.collect():
        for sample in family.samples:
            names.add(sample.name)
        names.add(family.name)
        if family.type == "counter":  # a labelled counter has no sample before its first use
            names.add(family.name + "_total")
    return names


def rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    return exprs + [v["definition"] for v in dash["templating"]["list"] if "definition" in v]


@pytest.mark.parametrize(
    "exprs",
    [
        pytest.param(lambda: [r["expr"] for r in rules()], id="rules"),
        pytest.param(dashboard_exprs, id="dashboard"),
    ],
)
def test_only_metrics_the_service_registers_are_used(exprs: Any) -> None:
    used = {m for e in exprs() for m in METRIC.findall(e)}
    assert used, "no metric found: the regex or the file is broken"
    assert used - registered() == set()


def test_the_dashboard_uses_recorded_series_that_exist_and_is_laid_out() -> None:
    recorded = {r["record"] for r in rules() if "record" in r}
    used = {m for e in dashboard_exprs() for m in RECORDED.findall(e)}
    assert used <= recorded
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24, p["title"]
    titles = {p["title"] for p in dash["panels"]}
    assert "Longest blocked by fragmentation" in titles


def test_the_alert_is_about_fragmentation_for_30_minutes() -> None:
    (alert,) = [
        r for r in rules() if r.get("alert") == "NodeagentGpuWorkloadsBlockedByFragmentation"
    ]
    assert "contiguity-gpus|contiguity-mig" in alert["expr"]
    assert "> 1800" in alert["expr"]


@pytest.mark.integration
@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["check", "rules", str(RULES)], id="check rules"),
        pytest.param(["test", "rules", str(RULE_TESTS)], id="test rules"),
    ],
)
def test_promtool(args: list[str]) -> None:
    result = subprocess.run(
        [require_tool("promtool"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=RULE_TESTS.parent,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def rbac_objects() -> list[dict[str, Any]]:
    return kustomize(KUSTOMIZE_DIR / "tiering" / "pending")


def test_the_rbac_is_schema_valid_and_reads_pods_only() -> None:
    require_module("kubernetes_validate")
    import kubernetes_validate

    objects = rbac_objects()
    for obj in objects:
        kubernetes_validate.validate(obj, "1.35.0", strict=True)
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
    assert not any(r.startswith("pods/") for _, r, _ in verbs)


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
    service = kustomize(KUSTOMIZE_DIR / "tiering")
    rbac = [o for o in service if o["kind"] in ("ClusterRole", "ClusterRoleBinding", "Role",
                                                "RoleBinding")]  # fmt: skip
    suffix = f"-{kube_ns[-5:]}"
    control_plane.apply(_retarget(rbac + rbac_objects(), kube_ns, suffix))
    kubeconfig = control_plane.service_account_kubeconfig(kube_ns, "nodeagent-tiering")
    kube = Kube(control_plane.api_client(kubeconfig), event_namespace=kube_ns)

    def granted() -> bool:
        # RBAC reaches the authorizer through an informer: new bindings apply a moment later.
        try:
            kube.list_pod_events("probe")
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
        TieringMetrics(CollectorRegistry()).pending,
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
        for o in _retarget(rbac + rbac_objects(), kube_ns, suffix):
            if o["kind"] == name:
                control_plane.kubectl("delete", name.lower(), o["metadata"]["name"], "--wait=false")
