"""The Helm chart (deploy/helm/nodeagent): lint, the kustomize base it must equal, its values.

helm is the one ``make kube-bins`` builds from the module pinned in hack/helm (or env
``HELM``); without it the tests skip, and with ``CI=true`` they fail. The chart's defaults must
render exactly the objects of ``kubectl kustomize deploy/kubernetes/base`` (and
``devicePlugin.enabled=false`` those of the exporter-only overlay), so a user can move between
the two without a diff. NVIDIA's device plugin values must reach the agent config with their
meaning, bad values must fail at install by the values schema, and the chart must install on
the real control plane with the documented line and upgrade in place.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodeagent.agent import config_select
from nodeagent.config.device_plugin import DeviceListStrategy, MigStrategy
from nodeagent.config.schema import load_agent_config
from nodeagent.testing.kube import waiting
from nodeagent.testing.kube.controlplane import ControlPlane
from nodeagent.testing.kube.deploy import Identities, rbac_objects, user_of, wait_bound
from nodeagent.testing.kube.nodes import KubeletStandIn, NodeSet
from tests.deploy.test_kubernetes import CRD_KINDS, agent_config, overlay_dir, validate
from tests.deploy.tools import KUSTOMIZE_DIR, REPO, in_ci, kustomize, object_key

CHART = REPO / "deploy" / "helm" / "nodeagent"
HELM_BUILD = REPO / "hack" / "helm" / "build.sh"
CONFIG_LABEL = "nvidia.com/device-plugin.config"
# What a values file from NVIDIA's device plugin chart sets, nodeagent's meaning of each.
NVIDIA_VALUES: dict[str, Any] = {
    "migStrategy": "single",
    "failOnInitError": False,
    "compatWithCPUManager": True,
    "deviceListStrategy": ["cdi-cri", "envvar"],
    "deviceIDStrategy": "uuid",
    "nvidiaDriverRoot": "/run/nvidia/driver",
    "runtimeClassName": "nvidia",
    "nodeSelector": {"nvidia.com/gpu.deploy.device-plugin": "true"},
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "feature.node.kubernetes.io/pci-10de.present",
                                "operator": "In",
                                "values": ["true"],
                            }
                        ]
                    }
                ]
            }
        }
    },
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "image": {"repository": "registry.example/nodeagent", "tag": "0.1.1", "pullPolicy": "Always"},
    "resources": {"requests": {"cpu": "50m", "memory": "200Mi"}},
    "gfd": {"enabled": True},
}
ENTRY = """\
version: v1
node:
  pool: {pool}
device_plugin:
  mig_strategy: {strategy}
pools:
  {pool}:
    sharing:
      mode: exclusive
"""
PER_NODE: dict[str, Any] = {
    "config": {
        "default": "default",
        "map": {
            "default": ENTRY.format(pool="default", strategy="none"),
            "mig-single": ENTRY.format(pool="inference", strategy="single"),
            "mig-mixed": ENTRY.format(pool="inference", strategy="mixed"),
        },
    }
}


def helm() -> str:
    """The pinned helm: env ``HELM``, else the one ``make kube-bins`` built; skipped without
    it, a failure under CI (like kubectl)."""
    explicit = os.environ.get("HELM")
    if explicit:
        if not Path(explicit).is_file():
            pytest.fail(f"HELM={explicit} does not exist")
        return explicit
    out = subprocess.run(
        ["bash", str(HELM_BUILD), "--dir"], capture_output=True, text=True, check=False
    )
    built = Path(out.stdout.strip().splitlines()[-1]) / "bin" / "helm" if out.stdout else None
    if built is not None and built.is_file():
        return str(built)
    message = "helm not built; run `make kube-bins` (builds it from hack/helm) or set HELM"
    if in_ci():
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def helm_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """helm's environment: its cache, config and data directories in a temporary dir."""
    home = tmp_path_factory.mktemp("helm-home")
    return {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
        "KUBECONFIG": str(home / "no-cluster"),
    }


def run_helm(
    env: Mapping[str, str], *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [helm(), *args], capture_output=True, text=True, env=dict(env), timeout=180, check=False
    )
    if check:
        assert result.returncode == 0, f"helm {' '.join(args)}: {result.stderr}"
    return result


def values_file(directory: Path, values: Mapping[str, Any]) -> Path:
    path = directory / f"values-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(dict(values)))
    return path


def render(
    env: Mapping[str, str],
    directory: Path,
    values: Mapping[str, Any] | None = None,
    *,
    release: str = "nodeagent",
    namespace: str = "nodeagent",
) -> dict[tuple[str, str, str], dict[str, Any]]:
    """``helm template`` of the chart, by object key."""
    args = ["template", release, str(CHART), "--namespace", namespace]
    if values:
        args += ["--values", str(values_file(directory, values))]
    text = run_helm(env, *args).stdout
    return {object_key(o): o for o in yaml.safe_load_all(text) if o}


def daemonset(objects: Mapping[Any, dict[str, Any]]) -> dict[str, Any]:
    (found,) = [o for (kind, _, _), o in objects.items() if kind == "DaemonSet"]
    return found


def pod_spec(objects: Mapping[Any, dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = daemonset(objects)["spec"]["template"]["spec"]
    return spec


def env_sorted(objects: dict[Any, dict[str, Any]]) -> dict[Any, dict[str, Any]]:
    """The objects with each container's env in name order: the order of variables that do
    not refer to each other means nothing, and a kustomize patch appends where helm inserts."""
    out = dict(objects)
    for key, obj in out.items():
        if obj["kind"] == "DaemonSet":
            copy = yaml.safe_load(yaml.safe_dump(obj))
            for c in copy["spec"]["template"]["spec"]["containers"]:
                c["env"] = sorted(c.get("env", []), key=lambda e: e["name"])
            out[key] = copy
    return out


# --- the chart itself ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({}, id="defaults"),
        pytest.param({**NVIDIA_VALUES, **PER_NODE, "tiering": {"enabled": True}}, id="all-on"),
    ],
)
def test_chart_passes_helm_lint_strict(
    helm_env: dict[str, str], tmp_path: Path, values: dict[str, Any]
) -> None:
    args = ["lint", "--strict", str(CHART), "--values", str(values_file(tmp_path, values))]
    result = run_helm(helm_env, *args)
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


def test_lint_strict_fails_on_a_broken_template(helm_env: dict[str, str], tmp_path: Path) -> None:
    # The lint above can fail: a copy of the chart with a template that does not parse.
    broken = tmp_path / "nodeagent"
    subprocess.run(["cp", "-rL", str(CHART), str(broken)], check=True)
    (broken / "templates" / "broken.yaml").write_text("kind: {{ .Values.image.repository\n")
    result = run_helm(helm_env, "lint", "--strict", str(broken), check=False)
    assert result.returncode != 0
    assert "1 chart(s) failed" in result.stdout + result.stderr


def test_default_values_render_the_kustomize_base(helm_env: dict[str, str], tmp_path: Path) -> None:
    chart = render(helm_env, tmp_path)
    base = {object_key(o): o for o in kustomize(KUSTOMIZE_DIR / "base")}
    assert sorted(chart) == sorted(base)
    for key, obj in base.items():
        assert chart[key] == obj, f"{key} differs between the chart and the kustomize base"


def test_device_plugin_disabled_renders_the_exporter_only_overlay(
    helm_env: dict[str, str], tmp_path: Path
) -> None:
    chart = render(helm_env, tmp_path, {"devicePlugin": {"enabled": False}})
    overlay = {object_key(o): o for o in kustomize(overlay_dir("exporter-only"))}
    assert sorted(chart) == sorted(overlay)
    assert env_sorted(chart) == env_sorted(overlay)


def test_tiering_enabled_adds_the_tiering_kustomization(
    helm_env: dict[str, str], tmp_path: Path
) -> None:
    chart = render(helm_env, tmp_path, {"tiering": {"enabled": True}})
    base = [*kustomize(KUSTOMIZE_DIR / "base"), *kustomize(KUSTOMIZE_DIR / "tiering")]
    assert chart == {object_key(o): o for o in base}


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({}, id="defaults"),
        pytest.param({"tiering": {"enabled": True}}, id="tiering"),
        pytest.param(NVIDIA_VALUES, id="nvidia-values"),
        pytest.param(PER_NODE, id="per-node-configs"),
        pytest.param({"devicePlugin": {"enabled": False}}, id="exporter-only"),
    ],
)
def test_rendered_objects_validate_against_the_pinned_schema(
    helm_env: dict[str, str], tmp_path: Path, values: dict[str, Any]
) -> None:
    objects = render(helm_env, tmp_path, values)
    for obj in objects.values():
        if obj["kind"] not in CRD_KINDS:
            validate(obj)


# --- values: NVIDIA's names, nodeagent's meaning -------------------------------------------------


def test_nvidia_values_reach_the_agent_config_and_the_pod(
    helm_env: dict[str, str], tmp_path: Path
) -> None:
    objects = render(helm_env, tmp_path, NVIDIA_VALUES)
    config = agent_config(objects)
    plugin = config.device_plugin
    assert plugin.mig_strategy is MigStrategy.SINGLE
    assert plugin.fail_on_init_error is False
    assert plugin.pass_device_specs is True
    assert plugin.strategies == (DeviceListStrategy.CDI_CRI, DeviceListStrategy.ENVVAR)
    assert plugin.dev_root == Path("/run/nvidia/driver/dev")
    # The rest of the file is the shipped config: only the strategy was written into it.
    assert config.pools.keys() == {"default", "inference-mig", "experiments"}
    spec = pod_spec(objects)
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["nodeSelector"] == {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.deploy.device-plugin": "true",
    }
    assert spec["affinity"] == NVIDIA_VALUES["affinity"]
    assert spec["tolerations"] == NVIDIA_VALUES["tolerations"]
    (c,) = spec["containers"]
    assert c["image"] == "registry.example/nodeagent:0.1.1"
    assert c["imagePullPolicy"] == "Always"
    assert c["resources"]["requests"] == {"cpu": "50m", "memory": "200Mi"}
    # The driver root is mounted where the host has it: device specs name host paths.
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "driver-root"]
    assert mount["mountPath"] == "/run/nvidia/driver"


def test_cdi_enabled_hands_devices_over_by_cdi(helm_env: dict[str, str], tmp_path: Path) -> None:
    # The GPU Operator's cdi.enabled: CDI device names in the CRI field, unless
    # deviceListStrategy says otherwise.
    config = agent_config(render(helm_env, tmp_path, {"cdi": {"enabled": True}}))
    assert config.device_plugin.strategies == (DeviceListStrategy.CDI_CRI,)
    both = {"cdi": {"enabled": True}, "deviceListStrategy": "volume-mounts"}
    config = agent_config(render(helm_env, tmp_path, both))
    assert config.device_plugin.strategies == (DeviceListStrategy.VOLUME_MOUNTS,)


@pytest.mark.parametrize(
    ("values", "where"),
    [
        pytest.param({"migStrategy": "bogus"}, "/migStrategy", id="migStrategy"),
        pytest.param({"deviceIDStrategy": "index"}, "/deviceIDStrategy", id="deviceIDStrategy"),
        pytest.param({"deviceListStrategy": "bogus"}, "/deviceListStrategy", id="list-strategy"),
        pytest.param({"failOnInitError": "yes"}, "/failOnInitError", id="failOnInitError"),
        pytest.param({"nvidiaDriverRoot": "run/nvidia"}, "/nvidiaDriverRoot", id="driver-root"),
        pytest.param(
            {"config": {"fallbackStrategies": ["first"]}}, "/config/fallbackStrategies/0", id="fb"
        ),
        pytest.param({"config": {"map": {"a b": "x"}}}, "'a b' does not match", id="entry"),
        pytest.param({"migstrategy": "mixed"}, "migstrategy", id="misspelt-name"),
        pytest.param({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy", id="pull"),
    ],
)
def test_schema_rejects_bad_values(
    helm_env: dict[str, str], tmp_path: Path, values: dict[str, Any], where: str
) -> None:
    args = ["template", "nodeagent", str(CHART), "--values", str(values_file(tmp_path, values))]
    result = run_helm(helm_env, *args, check=False)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert where in result.stderr, result.stderr


# --- docs/operations.md ----------------------------------------------------------------------


def operations_doc() -> str:
    return (REPO / "docs" / "operations.md").read_text()


def test_the_docs_give_the_helm_install_line_first() -> None:
    section = operations_doc().split("## Install on Kubernetes", 1)[1]
    first_block = section.split("```", 2)[1]
    assert first_block.startswith("sh\n")
    line = " ".join(first_block.removeprefix("sh\n").replace("\\\n", " ").split())
    assert line.startswith(
        "helm install nodeagent deploy/helm/nodeagent --namespace nodeagent --create-namespace"
    )


def test_the_docs_table_covers_every_value() -> None:
    # Every value a user can set is in the table or the paragraph after it; the groups of
    # switches are documented by their members.
    groups = {"config", "cdi", "gfd", "devicePlugin", "migManager", "namespace"}
    groups |= {"serviceMonitor", "prometheusRule"}
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    doc = operations_doc()
    for key, value in values.items():
        leaves = [f"{key}.{k}" for k in value] if key in groups else [key]
        for leaf in leaves:
            assert f"`{leaf}" in doc, f"value {leaf} is not documented in docs/operations.md"


def test_the_docs_per_node_example_installs(helm_env: dict[str, str], tmp_path: Path) -> None:
    section = operations_doc().split("**Per-node configs.**", 1)[1]
    example = yaml.safe_load(section.split("```yaml\n", 1)[1].split("```", 1)[0])
    objects = render(helm_env, tmp_path, example)
    entries = objects[("ConfigMap", "nodeagent", "nodeagent-configs")]["data"]
    assert sorted(entries) == ["inference.yaml", "training.yaml"]
    for key, text in entries.items():
        path = tmp_path / key
        path.write_text(text)
        load_agent_config(path, environ={})


# --- per-node configs chosen by a node label ----------------------------------------------------


def test_per_node_configs_render_an_entry_each_and_the_selecting_init_container(
    helm_env: dict[str, str], tmp_path: Path
) -> None:
    objects = render(helm_env, tmp_path, {**PER_NODE, "deviceListStrategy": "cdi-cri"})
    entries = objects[("ConfigMap", "nodeagent", "nodeagent-configs")]["data"]
    assert sorted(entries) == ["default.yaml", "mig-mixed.yaml", "mig-single.yaml"]
    for text in entries.values():
        # Each entry is a whole agent config, with the chart's list value written in.
        path = tmp_path / "entry.yaml"
        path.write_text(text)
        assert load_agent_config(path, environ={}).device_plugin.strategies == (
            DeviceListStrategy.CDI_CRI,
        )
    spec = pod_spec(objects)
    (init,) = spec["initContainers"]
    assert init["command"] == ["python", "-m", "nodeagent.agent.config_select"]
    assert "--default=default" in init["args"]
    (c,) = spec["containers"]
    # The agent reads what the init container wrote, at the usual path.
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == "/etc/nodeagent"]
    assert mount["name"] == "selected"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["configs"]["configMap"]["name"] == "nodeagent-configs"
    # An existing ConfigMap instead of the map: nothing rendered for it, the pod reads it.
    objects = render(helm_env, tmp_path, {"config": {"name": "my-configs", "default": "a"}})
    assert ("ConfigMap", "nodeagent", "nodeagent-configs") not in objects
    volumes = {v["name"]: v for v in pod_spec(objects)["volumes"]}
    assert volumes["configs"]["configMap"]["name"] == "my-configs"


def mount_config_map(directory: Path, data: Mapping[str, str]) -> Path:
    """A ConfigMap volume laid out as the kubelet lays it out: the files in a timestamped
    directory, ``..data`` linking to it, and each key a link through ``..data``."""
    directory.mkdir()
    stamp = directory / "..2026_12_04_00_00_00.000000001"
    stamp.mkdir()
    (directory / "..data").symlink_to(stamp.name)
    for key, text in data.items():
        (stamp / key).write_text(text)
        (directory / key).symlink_to(f"..data/{key}")
    return directory


def init_args(objects: Mapping[Any, dict[str, Any]], dirs: Mapping[str, Path]) -> list[str]:
    """The rendered init container's arguments, its mount paths moved to ``dirs``."""
    (init,) = pod_spec(objects)["initContainers"]
    mounts = {m["mountPath"]: dirs[m["name"]] for m in init["volumeMounts"]}
    out = []
    for arg in init["args"]:
        for mount_path, local in mounts.items():
            arg = arg.replace(f"={mount_path}", f"={local}")
        out.append(arg)
    return out


def test_the_node_label_chooses_the_config_on_the_api_server(
    helm_env: dict[str, str],
    tmp_path: Path,
    control_plane: ControlPlane,
    kube_identities: Identities,
    kube_nodes: NodeSet,
    capsys: pytest.CaptureFixture[str],
) -> None:
    objects = render(helm_env, tmp_path, PER_NODE)
    entries = objects[("ConfigMap", "nodeagent", "nodeagent-configs")]["data"]
    dirs = {
        "configs": mount_config_map(tmp_path / "configs", entries),
        "selected": tmp_path / "selected",
    }
    dirs["selected"].mkdir()
    args = init_args(objects, dirs)
    chosen = dirs["selected"] / "nodeagent.yaml"
    nodes = {
        "mig-single": kube_nodes.create("single", {CONFIG_LABEL: "mig-single"}),
        "default": kube_nodes.create("plain"),
        "missing": kube_nodes.create("typo", {CONFIG_LABEL: "mig-singel"}),
    }

    def select(node: str) -> int:
        # As the agent's own ServiceAccount: its ClusterRole's `get nodes` is all it needs.
        environ = {
            "NODE_NAME": node,
            "NODEAGENT_KUBERNETES_KUBECONFIG": str(kube_identities.agent.kubeconfig.path),
        }
        return config_select.main(args, environ)

    for wanted, strategy in (("mig-single", MigStrategy.SINGLE), ("default", MigStrategy.NONE)):
        assert select(nodes[wanted]) == 0
        assert chosen.read_text() == entries[f"{wanted}.yaml"]
        assert f"agent config {wanted!r}" in capsys.readouterr().out
        assert load_agent_config(chosen, environ={}).device_plugin.mig_strategy is strategy
    chosen.unlink()
    assert select(nodes["missing"]) == config_select.EXIT_USAGE
    err = capsys.readouterr().err
    assert f"{CONFIG_LABEL}=mig-singel names no config entry" in err
    assert "default, mig-mixed, mig-single" in err
    assert not chosen.exists(), "a node whose label names no entry got a config anyway"


# --- on the real API server ---------------------------------------------------------------------


def get(plane: ControlPlane, kind: str, name: str, namespace: str | None = None) -> Any:
    """One object as the API server has it now (JSON)."""
    where = ["--namespace", namespace] if namespace else []
    return json.loads(plane.kubectl("get", kind, name, *where, "--output", "json"))


@pytest.fixture
def release(control_plane: ControlPlane, helm_env: dict[str, str]) -> Iterator[tuple[str, str]]:
    """A release name and a namespace that does not exist yet; both removed afterwards."""
    name = f"na-{uuid.uuid4().hex[:6]}"
    yield name, name
    run_helm(
        helm_env,
        "uninstall",
        name,
        "--namespace",
        name,
        "--kubeconfig",
        str(control_plane.admin.path),
        check=False,
    )
    control_plane.delete_namespace(name)


def test_install_and_upgrade_in_place_on_the_api_server(
    helm_env: dict[str, str],
    tmp_path: Path,
    control_plane: ControlPlane,
    kube_nodes: NodeSet,
    kubelets: KubeletStandIn,
    release: tuple[str, str],
) -> None:
    name, namespace = release
    kubeconfig = ["--kubeconfig", str(control_plane.admin.path)]
    # No Prometheus Operator on the test control plane; a node label of this test's own keeps
    # other tests' GPU nodes out of the DaemonSet.
    values = values_file(
        tmp_path,
        {
            "serviceMonitor": {"enabled": False},
            "prometheusRule": {"enabled": False},
            "nodeSelector": {"nodeagent.io/helm-test": namespace},
        },
    )
    # The install line of docs/operations.md, with this test's names.
    run_helm(
        helm_env,
        "install",
        name,
        str(CHART),
        "--namespace",
        namespace,
        "--create-namespace",
        "--values",
        str(values),
        *kubeconfig,
    )
    labels = get(control_plane, "namespace", namespace)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    manifest = run_helm(helm_env, "get", "manifest", name, "-n", namespace, *kubeconfig).stdout
    objects = [o for o in yaml.safe_load_all(manifest) if o]
    wait_bound(control_plane, user_of(namespace, name), rbac_objects(objects))

    node = kube_nodes.create(
        "gpu", {"nvidia.com/gpu.present": "true", "nodeagent.io/helm-test": namespace}
    )

    def agent_pod(env_name: str | None) -> Any:
        def found(pods: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
            for pod in pods.values():
                if pod["spec"].get("nodeName") != node or pod["metadata"].get("deletionTimestamp"):
                    continue
                names = {e["name"] for e in pod["spec"]["containers"][0].get("env", [])}
                if env_name is None or env_name in names:
                    return pod
            return None

        return found

    first = waiting.pods(
        control_plane.api_client(), namespace, agent_pod(None), what=f"{name}'s pod on {node}"
    )
    assert first["spec"]["serviceAccountName"] == name
    before = get(control_plane, "daemonset", name, namespace)

    run_helm(
        helm_env,
        "upgrade",
        name,
        str(CHART),
        "--namespace",
        namespace,
        "--values",
        str(values),
        "--set",
        "migStrategy=single",
        *kubeconfig,
    )
    after = get(control_plane, "daemonset", name, namespace)
    assert after["metadata"]["uid"] == before["metadata"]["uid"], "the DaemonSet was replaced"
    assert after["metadata"]["generation"] == before["metadata"]["generation"] + 1
    (c,) = after["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["NODEAGENT_DEVICE_PLUGIN_MIG_STRATEGY"] == "single"
    # The rolling update replaces the node's pod with one of the new template.
    waiting.pods(
        control_plane.api_client(),
        namespace,
        agent_pod("NODEAGENT_DEVICE_PLUGIN_MIG_STRATEGY"),
        what=f"{name}'s upgraded pod on {node}",
        timeout_s=60,
    )
    # Per-node configs: the pod with its selecting init container passes admission too.
    per_node = values_file(tmp_path, PER_NODE)
    args = ["--values", str(values), "--values", str(per_node), *kubeconfig]
    run_helm(helm_env, "upgrade", name, str(CHART), "--namespace", namespace, *args)

    def selecting_pod(pods: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
        return next(
            (
                p
                for p in pods.values()
                if p["spec"].get("nodeName") == node and p["spec"].get("initContainers")
            ),
            None,
        )

    waiting.pods(
        control_plane.api_client(),
        namespace,
        selecting_pod,
        what=f"{name}'s pod with per-node configs on {node}",
        timeout_s=60,
    )
    history = json.loads(
        run_helm(helm_env, "history", name, "-n", namespace, "-o", "json", *kubeconfig).stdout
    )
    assert [(h["revision"], h["status"]) for h in history] == [
        (1, "superseded"),
        (2, "superseded"),
        (3, "deployed"),
    ]
