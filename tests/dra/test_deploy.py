"""The ``dra`` overlay: DRA on, the kubelet's plugin directories and the CDI dir mounted where
the config says, RBAC for ResourceSlices and claims, DeviceClasses that select the driver."""

from __future__ import annotations

from typing import Any

from tests.deploy.test_kubernetes import agent_config, container, one, overlay_dir
from tests.deploy.tools import kustomize, object_key


def objects() -> dict[tuple[str, str, str], dict[str, Any]]:
    return {object_key(o): o for o in kustomize(overlay_dir("dra"))}


def test_the_overlay_serves_dra_instead_of_the_device_plugin() -> None:
    found = objects()
    config = agent_config(found)
    assert config.dra.enabled
    assert not config.device_plugin.enabled
    mounts = {m["mountPath"] for m in container(found)["volumeMounts"]}
    for path in (config.dra.registry_dir, config.dra.plugin_dir, config.dra.cdi_spec_dir):
        assert str(path) in mounts
    assert str(config.device_plugin.kubelet_dir) not in mounts


def test_rbac_covers_resourceslices_and_claims() -> None:
    found = objects()
    (role,) = [o for (k, _, n), o in found.items() if k == "ClusterRole" and n == "nodeagent-dra"]
    rules = {(r["resources"][0], tuple(r["verbs"])) for r in role["rules"]}
    slices = next(v for res, v in rules if res == "resourceslices")
    assert {"create", "update", "delete", "list"} <= set(slices)
    assert ("resourceclaims", ("get",)) in rules


def test_device_classes_select_the_driver_by_type() -> None:
    found = objects()
    classes = {n: o for (k, _, n), o in found.items() if k == "DeviceClass"}
    assert set(classes) == {"gpu.nodeagent.io", "mig.nodeagent.io"}
    for name, kind in (("gpu.nodeagent.io", "gpu"), ("mig.nodeagent.io", "mig")):
        (selector,) = classes[name]["spec"]["selectors"]
        expression = selector["cel"]["expression"]
        assert "device.driver == 'gpu.nodeagent.io'" in expression
        assert f".type == '{kind}'" in expression
    assert one(found, "DaemonSet")
