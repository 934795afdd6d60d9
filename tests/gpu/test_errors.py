"""The NVML return code -> taxonomy mapping, and the bus-id / topology-level helpers."""

from __future__ import annotations

import pynvml
import pytest

from nodeagent.gpu import errors
from nodeagent.gpu._topology import link_kind_for_level, normalize_bus_id
from nodeagent.gpu.types import LinkKind

# The taxonomy by class: (raised by a call on a device, class, the NVML_ERROR_* codes it takes).
TAXONOMY: list[tuple[bool, type[errors.GpuError], tuple[str, ...]]] = [
    (True, errors.NotSupported, ("NOT_SUPPORTED", "FUNCTION_NOT_FOUND")),  # FUNCTION_: old driver
    (True, errors.PermissionDenied, ("NO_PERMISSION",)),
    (True, errors.InUse, ("IN_USE",)),
    (True, errors.InsufficientResources, ("INSUFFICIENT_RESOURCES",)),
    (True, errors.InvalidArgument, ("INVALID_ARGUMENT",)),
    (True, errors.NotFound, ("NOT_FOUND",)),
    (True, errors.GpuLost, ("GPU_IS_LOST", "UNKNOWN")),
    (True, errors.ResetRequired, ("RESET_REQUIRED",)),
    (True, errors.GpuError, ("CORRUPTED_INFOROM",)),  # any other code
    (False, errors.GpuError, ("UNKNOWN",)),  # UNKNOWN loses a GPU only on a call on it
    (False, errors.Transient, ("TIMEOUT",)),
    (False, errors.DriverNotLoaded, ("DRIVER_NOT_LOADED", "LIBRARY_NOT_FOUND",
                                     "LIB_RM_VERSION_MISMATCH")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("code", "on_device", "expected"),
    [
        pytest.param(
            getattr(pynvml, f"NVML_ERROR_{name}"),
            on_device,
            expected,
            id=f"{name.lower()}-{'device' if on_device else 'node-wide'}",
        )
        for on_device, expected, names in TAXONOMY
        for name in names
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
