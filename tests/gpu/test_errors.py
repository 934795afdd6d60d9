"""The NVML return code -> taxonomy mapping, and the bus-id / topology-level helpers."""

from __future__ import annotations

import pynvml
import pytest

from nodeagent.gpu import errors
from nodeagent.gpu._topology import link_kind_for_level, normalize_bus_id
from nodeagent.gpu.types import LinkKind


@pytest.mark.parametrize(
    ("code", "on_device", "expected"),
    [
        pytest.param(
            pynvml.NVML_ERROR_NOT_SUPPORTED, True, errors.NotSupported, id="not-supported"
        ),
        pytest.param(
            pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, True, errors.NotSupported, id="old-driver"
        ),
        pytest.param(
            pynvml.NVML_ERROR_NO_PERMISSION, True, errors.PermissionDenied, id="permission"
        ),
        pytest.param(pynvml.NVML_ERROR_IN_USE, True, errors.InUse, id="in-use"),
        pytest.param(
            pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES, True, errors.InsufficientResources, id="full"
        ),
        pytest.param(pynvml.NVML_ERROR_INVALID_ARGUMENT, True, errors.InvalidArgument, id="arg"),
        pytest.param(pynvml.NVML_ERROR_NOT_FOUND, True, errors.NotFound, id="not-found"),
        pytest.param(pynvml.NVML_ERROR_GPU_IS_LOST, True, errors.GpuLost, id="lost"),
        pytest.param(pynvml.NVML_ERROR_UNKNOWN, True, errors.GpuLost, id="unknown-on-a-gpu"),
        pytest.param(pynvml.NVML_ERROR_UNKNOWN, False, errors.GpuError, id="unknown-node-wide"),
        pytest.param(pynvml.NVML_ERROR_RESET_REQUIRED, True, errors.ResetRequired, id="reset"),
        pytest.param(pynvml.NVML_ERROR_TIMEOUT, False, errors.Transient, id="timeout"),
        pytest.param(
            pynvml.NVML_ERROR_DRIVER_NOT_LOADED, False, errors.DriverNotLoaded, id="driver"
        ),
        pytest.param(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, False, errors.DriverNotLoaded, id="lib"),
        pytest.param(
            pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, False, errors.DriverNotLoaded, id="mismatch"
        ),
        pytest.param(pynvml.NVML_ERROR_CORRUPTED_INFOROM, True, errors.GpuError, id="other"),
    ],
)
def test_nvml_codes_map_to_the_taxonomy(
    code: int, on_device: bool, expected: type[errors.GpuError]
) -> None:
    assert errors.error_class(code, on_device=on_device) is expected


def test_literal_codes_agree_with_pynvml() -> None:
    for name in dir(errors):
        if name.startswith("NVML_ERROR_") or name == "NVML_SUCCESS":
            assert getattr(errors, name) == getattr(pynvml, name), name


def test_from_nvml_builds_a_one_line_message() -> None:
    error = errors.from_nvml(
        pynvml.NVML_ERROR_IN_USE, "In use by another client", function="nvmlGpuInstanceDestroy",
        gpu_index=4,
    )  # fmt: skip
    assert isinstance(error, errors.InUse)
    assert str(error) == (
        "nvmlGpuInstanceDestroy on GPU 4 failed: In use by another client (NVML error 19)"
    )
    assert (error.function, error.gpu_index, error.nvml_code) == ("nvmlGpuInstanceDestroy", 4, 19)


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        pytest.param("00000000:18:00.0", "00000000:18:00.0", id="busId"),
        pytest.param("0000:18:00.0", "00000000:18:00.0", id="busIdLegacy"),
        pytest.param("00000000:AB:00.0", "00000000:ab:00.0", id="upper-case"),
        pytest.param("18:00.0", "00000000:18:00.0", id="no-domain"),
    ],
)
def test_bus_ids_compare_in_one_form(raw: str, canonical: str) -> None:
    assert normalize_bus_id(raw) == canonical


@pytest.mark.parametrize(
    ("level", "kind"),
    [
        pytest.param(pynvml.NVML_TOPOLOGY_INTERNAL, LinkKind.SELF, id="internal"),
        pytest.param(pynvml.NVML_TOPOLOGY_SINGLE, LinkKind.PCIE_SINGLE, id="single"),
        pytest.param(pynvml.NVML_TOPOLOGY_MULTIPLE, LinkKind.PCIE_MULTIPLE, id="multiple"),
        pytest.param(pynvml.NVML_TOPOLOGY_HOSTBRIDGE, LinkKind.PCIE_HOSTBRIDGE, id="hostbridge"),
        pytest.param(pynvml.NVML_TOPOLOGY_NODE, LinkKind.NODE, id="node"),
        pytest.param(pynvml.NVML_TOPOLOGY_SYSTEM, LinkKind.SYSTEM, id="system"),
        pytest.param(60, LinkKind.SYSTEM, id="unknown-is-farthest"),
    ],
)
def test_topology_levels(level: int, kind: LinkKind) -> None:
    assert link_kind_for_level(level) is kind
