"""The committed API stubs are exactly what the protos generate, and carry the kubelet's names."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeagent.kubelet import generate
from nodeagent.kubelet.deviceplugin.v1beta1 import api_pb2 as dp
from nodeagent.kubelet.podresources.v1 import api_pb2 as pr


def test_committed_stubs_match_a_fresh_generation(tmp_path: Path) -> None:
    written = generate.generate(tmp_path)
    assert len(written) == len(generate.outputs())
    stale = [
        str(rel)
        for rel in generate.outputs()
        if (tmp_path / rel).read_bytes() != (generate.REPO_ROOT / rel).read_bytes()
    ]
    assert not stale, f"regenerate with `python -m nodeagent.kubelet.generate`: {stale}"


@pytest.mark.parametrize(
    ("message", "field", "number"),
    [
        pytest.param(dp.RegisterRequest, "resource_name", 3, id="register-resource"),
        pytest.param(dp.RegisterRequest, "options", 4, id="register-options"),
        pytest.param(dp.DevicePluginOptions, "get_preferred_allocation_available", 2, id="opts"),
        pytest.param(dp.Device, "topology", 3, id="device-topology"),
        pytest.param(dp.ContainerPreferredAllocationRequest, "allocation_size", 3, id="size"),
        pytest.param(
            dp.ContainerPreferredAllocationRequest, "must_include_deviceIDs", 2, id="must"
        ),
        pytest.param(dp.ContainerAllocateResponse, "cdi_devices", 5, id="cdi"),
        pytest.param(dp.ContainerAllocateResponse, "annotations", 4, id="annotations"),
        pytest.param(dp.DeviceSpec, "permissions", 3, id="devspec"),
        pytest.param(pr.ContainerDevices, "device_ids", 2, id="pr-device-ids"),
        pytest.param(pr.PodResources, "memory", 5, id="pr-pod-memory"),
        pytest.param(pr.ContainerResources, "dynamic_resources", 5, id="pr-dynamic"),
        pytest.param(pr.ClaimResource, "share_id", 5, id="pr-share-id"),
    ],
)
def test_field_numbers_are_the_kubelets(message: type, field: str, number: int) -> None:
    assert message.DESCRIPTOR.fields_by_name[field].number == number


def test_service_full_names_are_the_kubelets() -> None:
    assert dp.DESCRIPTOR.services_by_name["DevicePlugin"].full_name == "v1beta1.DevicePlugin"
    assert dp.DESCRIPTOR.services_by_name["Registration"].full_name == "v1beta1.Registration"
    lister = pr.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert lister.full_name == "v1.PodResourcesLister"
    assert [m.name for m in lister.methods] == ["List", "GetAllocatableResources", "Get"]


def test_pod_resources_reserves_the_removed_class_name_field() -> None:
    assert "class_name" not in pr.DynamicResource.DESCRIPTOR.fields_by_name
    assert 1 not in pr.DynamicResource.DESCRIPTOR.fields_by_number


def test_dra_service_names_are_the_kubelets() -> None:
    from nodeagent.kubelet.dra.v1 import api_pb2 as dra1
    from nodeagent.kubelet.dra.v1beta1 import api_pb2 as dra1b
    from nodeagent.kubelet.drahealth.v1alpha1 import api_pb2 as health
    from nodeagent.kubelet.pluginregistration.v1 import api_pb2 as reg

    assert reg.DESCRIPTOR.services_by_name["Registration"].full_name == (
        "pluginregistration.Registration"
    )
    for module, version in ((dra1, "v1"), (dra1b, "v1beta1")):
        service = module.DESCRIPTOR.services_by_name["DRAPlugin"]
        assert service.full_name == f"k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin"
        assert [m.name for m in service.methods] == [
            "NodePrepareResources",
            "NodeUnprepareResources",
        ]
    watch = health.DESCRIPTOR.services_by_name["DRAResourceHealth"]
    assert watch.full_name == "v1alpha1.DRAResourceHealth"


@pytest.mark.parametrize(
    ("module", "message", "field", "number"),
    [
        ("pluginregistration.v1", "PluginInfo", "supported_versions", 4),
        ("pluginregistration.v1", "RegistrationStatus", "error", 2),
        ("dra.v1", "Device", "cdi_device_ids", 4),
        ("dra.v1", "Device", "share_id", 5),
        ("dra.v1", "NodePrepareResourceResponse", "error", 2),
        ("dra.v1", "Claim", "name", 3),
        ("dra.v1beta1", "Device", "pool_name", 2),
        ("dra.v1beta1", "Claim", "uid", 2),
        ("drahealth.v1alpha1", "DeviceHealth", "health_check_timeout_seconds", 4),
        ("drahealth.v1alpha1", "DeviceHealth", "message", 5),
    ],
)
def test_dra_field_numbers_are_the_kubelets(
    module: str, message: str, field: str, number: int
) -> None:
    import importlib

    pb = importlib.import_module(f"nodeagent.kubelet.{module}.api_pb2")
    descriptor = pb.DESCRIPTOR.message_types_by_name[message]
    assert descriptor.fields_by_name[field].number == number


def test_v1beta1_dra_device_has_no_share_id() -> None:
    from nodeagent.kubelet.dra.v1beta1 import api_pb2 as dra1b

    assert "share_id" not in dra1b.Device.DESCRIPTOR.fields_by_name
