"""The ``dra`` section: the Dynamic Resource Allocation kubelet plugin, and its per-pool part."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, Field

from nodeagent.config.loader import Schema
from nodeagent.config.types import dns_subdomain

DEFAULT_DRIVER = "gpu.nodeagent.io"


def _driver_name(name: str) -> str:
    # ResourceSlice spec.driver: a DNS subdomain of at most 63 characters.
    return dns_subdomain(name, 63, "DRA driver name")


class DeviceClassNames(enum.StrEnum):
    """Which DeviceClass names the manifests and docs use."""

    NODEAGENT = "nodeagent"  # gpu.nodeagent.io, mig.nodeagent.io
    NVIDIA = "nvidia"  # gpu.nvidia.com, mig.nvidia.com (for claims written for NVIDIA's driver)


class DraSection(Schema):
    """The DRA kubelet plugin: ResourceSlices, prepare/unprepare, CDI specs."""

    enabled: bool = Field(
        False, description="serve the DRA kubelet plugin (beside or instead of the device plugin)"
    )
    driver_name: Annotated[str, AfterValidator(_driver_name)] = Field(
        DEFAULT_DRIVER, description="the DRA driver name: ResourceSlices, sockets, CDI kind"
    )
    registry_dir: Path = Field(
        Path("/var/lib/kubelet/plugins_registry"),
        description="the kubelet's plugin-registration directory (<driver>-reg.sock goes here)",
    )
    plugin_dir: Path = Field(
        Path("/var/lib/kubelet/plugins"),
        description="the service socket is <plugin_dir>/<driver>/dra.sock",
    )
    cdi_spec_dir: Path = Field(
        Path("/var/run/cdi"), description="where the CDI spec of each prepared claim is written"
    )
    publish_slices: bool = Field(
        True, description="publish ResourceSlices (needs kubernetes.enabled)"
    )
    mps_root: Path = Field(
        Path("/run/nodeagent/dra/mps"),
        description="MPS daemons of claims, per device: <root>/<uuid>/pipe and log (the "
        "binary and timeouts are device_plugin.mps's)",
    )
    device_classes: DeviceClassNames = Field(
        DeviceClassNames.NODEAGENT, description="DeviceClass names: nodeagent or nvidia"
    )


class PoolDra(Schema):
    """What a pool wants from the DRA plugin."""

    dynamic_mig: bool = Field(
        False,
        description="offer every MIG placement as a partitionable device and create the "
        "instance at prepare (MIG mode must be on: mig_layout all-enabled)",
    )
    withdraw_stranding: bool = Field(
        False,
        description="publish only each profile's best free placement (the planner's choice), so "
        "the scheduler cannot strand slices",
    )
