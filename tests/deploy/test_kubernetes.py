"""The Kubernetes manifests: schema validation, cross-references, and the agent config they carry.

Core objects are validated with kubernetes-validate against the pinned Kubernetes version, in
strict mode (unknown fields are errors), then go to the real kube-apiserver: ``kubectl apply
--dry-run=server`` (admission and validation), then applied for real, where the DaemonSet's pod
must pass admission on a GPU node and the RBAC objects must bind. The Prometheus Operator's
objects are not in those schemas and its CRDs are not on the test control plane; their
structure is checked here against the fields the operator reads.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from nodeagent.config.schema import AgentConfig, load_agent_config
from nodeagent.testing.kube import waiting
from nodeagent.testing.kube.controlplane import ControlPlane, ControlPlaneError
from nodeagent.testing.kube.deploy import (
    Identities,
    kubectl_apply,
    kubectl_delete,
    rbac_objects,
    render,
    wait_bound,
)
from nodeagent.testing.kube.nodes import KubeletStandIn, NodeSet
from nodeagent_exporters import rules
from tests.deploy.tools import (
    KUSTOMIZE_DIR,
    REPO,
    kustomize,
    object_key,
    require_module,
    require_tool,
)

# The Kubernetes version whose schemas every manifest must satisfy (kubernetes-validate ships
# 1.25 to 1.37; 1.35 is the newest minor most managed clusters offer).
KUBERNETES_VERSION = "1.35.0"
OVERLAYS = ("plugin-exporter", "exporter-only", "dra")
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}
DURATION = re.compile(r"^(0|(\d+y)?(\d+w)?(\d+d)?(\d+h)?(\d+m)?(\d+s)?(\d+ms)?)$")


def overlay_dir(name: str) -> Path:
    return KUSTOMIZE_DIR / "overlays" / name


@pytest.fixture(params=[pytest.param(o, id=o) for o in OVERLAYS], scope="module")
def overlay(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def objects(overlay: str) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {object_key(o): o for o in kustomize(overlay_dir(overlay))}


def one(objects: dict[tuple[str, str, str], dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [o for (k, _, _), o in objects.items() if k == kind]
    return found


def container(objects: dict[tuple[str, str, str], dict[str, Any]]) -> dict[str, Any]:
    (c,) = one(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    return c


def validate(obj: dict[str, Any]) -> None:
    require_module("kubernetes_validate")
    import kubernetes_validate

    kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_core_objects_validate_against_the_pinned_schema(
    objects: dict[Any, dict[str, Any]],
) -> None:
    kinds = set()
    for obj in objects.values():
        kinds.add(obj["kind"])
        if obj["kind"] not in CRD_KINDS:
            validate(obj)
    expected = {"Namespace", "ServiceAccount", "ConfigMap", "DaemonSet", "Service"}
    assert expected | CRD_KINDS <= kinds
    assert {"ClusterRole", "ClusterRoleBinding"} & kinds or {"Role", "RoleBinding"} & kinds


def test_validation_rejects_an_unknown_field(objects: dict[Any, dict[str, Any]]) -> None:
    # The validation above must be able to fail: strict mode rejects a misspelt field.
    require_module("kubernetes_validate")
    import kubernetes_validate

    daemonset = yaml.safe_load(yaml.safe_dump(one(objects, "DaemonSet")))
    daemonset["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(daemonset)


# --- what the DaemonSet runs -------------------------------------------------------------------


def agent_config(objects: dict[Any, dict[str, Any]]) -> AgentConfig:
    """The config the agent in this overlay runs with: the ConfigMap file plus the pod's env."""
    c = container(objects)
    args = c["args"]
    config_path = Path(args[args.index("--config") + 1])
    volumes = {
        v["name"]: v for v in one(objects, "DaemonSet")["spec"]["template"]["spec"]["volumes"]
    }
    (mount,) = [m for m in c["volumeMounts"] if config_path.is_relative_to(m["mountPath"])]
    config_map = next(
        o
        for (k, _, n), o in objects.items()
        if k == "ConfigMap" and n == volumes[mount["name"]]["configMap"]["name"]
    )
    text = config_map["data"][config_path.name]
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    return load_text(text, env)


def load_text(text: str, environ: dict[str, str]) -> AgentConfig:
    """A ConfigMap's file read as the agent reads it: from a file, under the pod's env."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "nodeagent.yaml"
        path.write_text(text)
        return load_agent_config(path, environ=environ)


@pytest.mark.parametrize(
    ("overlay_name", "plugin", "mig"),
    [
        pytest.param("plugin-exporter", True, True, id="plugin-exporter"),
        pytest.param("exporter-only", False, False, id="exporter-only"),
        pytest.param("dra", False, True, id="dra"),
    ],
)
def test_overlay_turns_features_on_and_off(overlay_name: str, plugin: bool, mig: bool) -> None:
    objects = {object_key(o): o for o in kustomize(overlay_dir(overlay_name))}
    config = agent_config(objects)
    assert config.device_plugin.enabled is plugin
    assert config.mig.enabled is mig
    assert config.metrics.enabled
    assert config.kubernetes.enabled
    c = container(objects)
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert (str(config.device_plugin.kubelet_dir) in mounts) is plugin
    added = c["securityContext"]["capabilities"].get("add", [])
    # CAP_SYS_ADMIN only where MIG is changed.
    assert ("SYS_ADMIN" in added) is mig


def test_mounts_match_the_config(objects: dict[Any, dict[str, Any]]) -> None:
    config = agent_config(objects)
    spec = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    c = container(objects)
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    mounted = {m["mountPath"]: host.get(m["name"]) for m in c["volumeMounts"]}
    # Host directories appear at the same path inside the container, so paths in the config,
    # in logs and in the docs mean the same thing everywhere. The one exception is the host's
    # /proc, which cannot sit on the container's own /proc: metrics.proc_root names it.
    for path, host_path in mounted.items():
        if host_path == "/proc":
            assert path == str(config.metrics.proc_root)
            continue
        assert host_path in (None, path)
    assert mounted.get(str(config.metrics.proc_root)) == "/proc"
    assert str(config.state_dir) in mounted
    assert str(config.metrics.pod_resources_socket.parent) in mounted
    if config.device_plugin.enabled:
        assert str(config.device_plugin.kubelet_dir) in mounted
    # The `cdi` strategy and the DRA driver write CDI specs that the container runtime reads
    # on the host: their directory is the host's, whichever strategy the config names today
    # (switching to `cdi` is a config change, not a manifest change); an agent that serves no
    # devices does not mount it.
    serves = [
        (config.device_plugin.cdi_spec_dir, config.device_plugin.enabled),
        (config.dra.cdi_spec_dir, config.dra.enabled),
    ]
    for spec_dir, enabled in serves:
        if enabled:
            assert mounted.get(str(spec_dir)) == str(spec_dir), f"{spec_dir} is not the host's"
    if not any(enabled for _, enabled in serves):
        assert not {str(d) for d, _ in serves} & mounted.keys(), "mounted by an exporter only"
    assert {m["name"] for m in c["volumeMounts"]} == {v["name"] for v in spec["volumes"]}


def test_daemonset_wiring(objects: dict[Any, dict[str, Any]]) -> None:
    daemonset = one(objects, "DaemonSet")
    spec = daemonset["spec"]
    pod = spec["template"]
    c = container(objects)
    config = agent_config(objects)
    assert spec["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert spec["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1},
    }
    assert pod["spec"]["nodeSelector"], "the agent runs on GPU nodes only"
    assert pod["spec"]["tolerations"]
    node_name = next(e for e in c["env"] if e["name"] == "NODE_NAME")
    assert node_name["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    # Probes hit the metrics port the config serves on.
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["metrics"] == int(config.metrics.address.rsplit(":", 1)[1])
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= c["resources"][kind].keys()
    # The API server refuses allowPrivilegeEscalation: false next to CAP_SYS_ADMIN, which the
    # schema cannot express; it checks only that spelling of the capability (the short
    # SYS_ADMIN passes, test_server_dry_run_refuses_what_only_the_api_server_checks), so keep
    # the two apart whatever the spelling.
    security = c["securityContext"]
    if "SYS_ADMIN" in security["capabilities"].get("add", []):
        assert security.get("allowPrivilegeEscalation") is not False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert security["readOnlyRootFilesystem"] is True
    accounts = {n for (k, _, n) in objects if k == "ServiceAccount"}
    assert pod["spec"]["serviceAccountName"] in accounts


def test_rbac_binds_the_agent_service_account(objects: dict[Any, dict[str, Any]]) -> None:
    account = one(objects, "ServiceAccount")["metadata"]
    subjects = [
        s
        for (k, _, _), o in objects.items()
        if k in ("ClusterRoleBinding", "RoleBinding")
        for s in o.get("subjects", [])
    ]
    assert {
        "kind": "ServiceAccount",
        "name": account["name"],
        "namespace": account["namespace"],
    } in subjects


def test_service_and_servicemonitor_reach_the_pods(objects: dict[Any, dict[str, Any]]) -> None:
    service = one(objects, "Service")
    pod_labels = one(objects, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] in {p["name"] for p in container(objects)["ports"]}
    monitor = one(objects, "ServiceMonitor")
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] == port["name"]


# --- Prometheus Operator objects -----------------------------------------------------------------

SERVICEMONITOR_SPEC = {
    "jobLabel",
    "targetLabels",
    "podTargetLabels",
    "endpoints",
    "selector",
    "namespaceSelector",
    "sampleLimit",
    "targetLimit",
    "labelLimit",
    "labelNameLengthLimit",
    "labelValueLengthLimit",
    "attachMetadata",
    "scrapeProtocols",
    "fallbackScrapeProtocol",
    "scrapeClass",
    "bodySizeLimit",
    "keepDroppedTargets",
    "selectorMechanism",
}
ENDPOINT_FIELDS = {
    "port",
    "targetPort",
    "path",
    "scheme",
    "params",
    "interval",
    "scrapeTimeout",
    "tlsConfig",
    "bearerTokenFile",
    "bearerTokenSecret",
    "authorization",
    "honorLabels",
    "honorTimestamps",
    "trackTimestampsStaleness",
    "basicAuth",
    "oauth2",
    "metricRelabelings",
    "relabelings",
    "proxyUrl",
    "followRedirects",
    "enableHttp2",
    "filterRunning",
}
RELABEL_FIELDS = {
    "sourceLabels",
    "separator",
    "targetLabel",
    "regex",
    "modulus",
    "replacement",
    "action",
}
RELABEL_ACTIONS = {
    "replace",
    "keep",
    "drop",
    "hashmod",
    "labelmap",
    "labeldrop",
    "labelkeep",
    "lowercase",
    "uppercase",
    "keepequal",
    "dropequal",
}


def seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)(ms|[smhdwy])", duration))


def check_metadata(obj: dict[str, Any]) -> None:
    assert obj["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(obj) == {"apiVersion", "kind", "metadata", "spec"}
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", obj["metadata"]["name"])
    assert obj["metadata"]["namespace"]


def test_servicemonitor_structure(objects: dict[Any, dict[str, Any]]) -> None:
    monitor = one(objects, "ServiceMonitor")
    check_metadata(monitor)
    spec = monitor["spec"]
    assert set(spec) <= SERVICEMONITOR_SPEC, set(spec) - SERVICEMONITOR_SPEC
    assert spec["selector"]["matchLabels"]
    assert spec["endpoints"]
    for endpoint in spec["endpoints"]:
        assert set(endpoint) <= ENDPOINT_FIELDS, set(endpoint) - ENDPOINT_FIELDS
        for key in ("interval", "scrapeTimeout"):
            assert DURATION.match(endpoint[key]), endpoint[key]
        assert seconds(endpoint["scrapeTimeout"]) <= seconds(endpoint["interval"])
        assert endpoint["path"].startswith("/")
        for relabel in endpoint.get("relabelings", []) + endpoint.get("metricRelabelings", []):
            assert set(relabel) <= RELABEL_FIELDS
            assert relabel.get("action", "replace") in RELABEL_ACTIONS


def test_prometheusrule_is_generated_from_the_rule_files() -> None:
    shipped = REPO / rules.PROMETHEUS_RULE
    assert shipped.read_text() == rules.prometheus_rule_text(REPO / rules.RULES_DIR), (
        f"{rules.PROMETHEUS_RULE} is stale: run `make rules`"
    )


def test_prometheusrule_structure(objects: dict[Any, dict[str, Any]], tmp_path: Path) -> None:
    rule = one(objects, "PrometheusRule")
    check_metadata(rule)
    assert set(rule["spec"]) == {"groups"}
    groups = rule["spec"]["groups"]
    names = [g["name"] for g in groups]
    assert len(names) == len(set(names)), "group names must be unique"
    for group in groups:
        assert set(group) <= {
            "name",
            "interval",
            "rules",
            "limit",
            "partial_response_strategy",
            "query_offset",
            "labels",
        }
        if "interval" in group:
            assert DURATION.match(group["interval"])
        for r in group["rules"]:
            assert set(r) <= {
                "alert",
                "record",
                "expr",
                "for",
                "keep_firing_for",
                "labels",
                "annotations",
            }
            assert ("alert" in r) != ("record" in r), r
            assert isinstance(r["expr"], str)
            assert r["expr"].strip()
            for key in ("for", "keep_firing_for"):
                if key in r:
                    assert DURATION.match(r[key]), r[key]
            for key in ("labels", "annotations"):
                assert all(isinstance(v, str) for v in r.get(key, {}).values()), r
    # promtool reads exactly the groups the operator hands Prometheus.
    promtool = require_tool("promtool")
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(yaml.safe_dump({"groups": groups}))
    result = subprocess.run(
        [promtool, "check", "rules", str(rules_file)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_config_map_loads_as_an_agent_config(objects: dict[Any, dict[str, Any]]) -> None:
    config_map = one(objects, "ConfigMap")
    text = config_map["data"]["nodeagent.yaml"]
    assert yaml.safe_load(text)["version"] == "v1"
    config = load_text(text, {})
    assert config.pool == config.pools[config.node.pool]
    assert len(config.pools) > 1, "the example shows more than one pool policy"


# --- on the real API server ---------------------------------------------------------------------


def core_objects(plane: ControlPlane, overlay_name: str) -> list[dict[str, Any]]:
    """The overlay without the Prometheus Operator's kinds: the test control plane has no
    Prometheus Operator, so its CRDs are not there (their structure is checked above)."""
    return [o for o in render(plane, overlay_dir(overlay_name)) if o["kind"] not in CRD_KINDS]


@pytest.mark.parametrize("overlay_name", OVERLAYS)
def test_overlay_is_accepted_by_the_api_server_and_binds(
    overlay_name: str,
    control_plane: ControlPlane,
    kube_identities: Identities,
    kube_nodes: NodeSet,
    kubelets: KubeletStandIn,
) -> None:
    objects = core_objects(control_plane, overlay_name)
    # Admission and validation of every object, nothing stored.
    answered = kubectl_apply(control_plane, objects, dry_run=True)
    assert [object_key(o) for o in answered] == [object_key(o) for o in objects]
    names = {o["metadata"]["name"] for o in answered if o["kind"] == "DaemonSet"}
    assert (
        not client.AppsV1Api(control_plane.api_client())
        .list_namespaced_daemon_set("nodeagent", field_selector=f"metadata.name={names.pop()}")
        .items
    ), "a dry run stored the DaemonSet"
    workloads = [o for o in objects if o["kind"] in ("DaemonSet", "ConfigMap", "Service")]
    try:
        kubectl_apply(control_plane, objects)
        # A GPU node: the DaemonSet's pod for it passes admission (Pod Security "privileged"
        # in the namespace, the pod's own validation) and is bound there.
        gpu_node = kube_nodes.create("gpu", {"nvidia.com/gpu.present": "true"})

        def daemon_pod(pods: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
            return next((p for p in pods.values() if p["spec"].get("nodeName") == gpu_node), None)

        pod = waiting.pods(
            control_plane.api_client(),
            "nodeagent",
            daemon_pod,
            what=f"DaemonSet nodeagent ({overlay_name}): a pod on node {gpu_node}",
        )
        assert pod["spec"]["serviceAccountName"] == kube_identities.agent.name
        # The RBAC objects bind: the authorizer grants the agent's account every rule.
        wait_bound(control_plane, kube_identities.agent.user, rbac_objects(objects))
    finally:
        kubectl_delete(control_plane, workloads)


def test_server_dry_run_refuses_what_only_the_api_server_checks(
    control_plane: ControlPlane, kube_identities: Identities
) -> None:
    # The dry run above can fail: the API server refuses `allowPrivilegeEscalation: false`
    # next to the capability CAP_SYS_ADMIN, a rule no schema carries. (It checks that spelling
    # only; the manifests' short SYS_ADMIN passes, see test_daemonset_wiring.)
    (daemonset,) = [
        o for o in core_objects(control_plane, "plugin-exporter") if o["kind"] == "DaemonSet"
    ]
    (c,) = daemonset["spec"]["template"]["spec"]["containers"]
    validate(daemonset)  # the schema has nothing against it
    c["securityContext"]["capabilities"]["add"] = ["CAP_SYS_ADMIN"]
    c["securityContext"]["allowPrivilegeEscalation"] = False
    validate(daemonset)
    with pytest.raises(ControlPlaneError) as refused:
        kubectl_apply(control_plane, [daemonset], dry_run=True)
    assert "cannot set `allowPrivilegeEscalation` to false" in str(refused.value)
