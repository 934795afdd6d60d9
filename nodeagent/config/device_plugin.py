"""The ``device_plugin`` section: the kubelet device plugin servers.

Sharing normally comes from the pool policy (``pools.<name>.sharing`` and ``gpu_sharing``). For
clusters moving over from NVIDIA's plugin, ``device_plugin.sharing`` also accepts NVIDIA's
``sharing.timeSlicing`` / ``sharing.mps`` shapes; unlike NVIDIA's plugin, their ``devices`` and
``rename`` fields are honoured, so one node can mix modes and replica counts per GPU.
"""

from __future__ import annotations

import enum
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import BeforeValidator, Field, field_validator, model_validator

from nodeagent.config.errors import FieldError
from nodeagent.config.loader import Schema
from nodeagent.config.pool_policy import MAX_MPS_REPLICAS, MAX_REPLICAS, Sharing, SharingMode

RESOURCE_PREFIX = "nvidia.com/"
SHARED_SUFFIX = ".shared"

# What NVIDIA's plugin accepts in a `devices` list: a GPU index, a MIG index "gpu:mig", or a
# GPU / MIG UUID.
_DEVICE_REF = re.compile(r"^(\d{1,4}|\d{1,4}:\d{1,2}|(GPU|MIG)-[0-9A-Za-z][0-9A-Za-z/-]*)$")


class MigStrategy(enum.StrEnum):
    """NVIDIA's MIG strategies: how MIG devices become Kubernetes resources."""

    NONE = "none"  # every GPU is nvidia.com/gpu, MIG or not
    SINGLE = "single"  # MIG devices are nvidia.com/gpu; all GPUs must agree on one profile
    MIXED = "mixed"  # one resource per profile, nvidia.com/mig-<profile>


class DeviceListStrategy(enum.StrEnum):
    """How Allocate tells the container runtime which devices a container gets."""

    ENVVAR = "envvar"  # NVIDIA_VISIBLE_DEVICES=<ids>
    VOLUME_MOUNTS = "volume-mounts"  # /dev/null mounts under /var/run/nvidia-container-devices
    CDI_ANNOTATIONS = "cdi-annotations"  # CDI device names in container annotations
    CDI_CRI = "cdi-cri"  # CDI device names in the CRI cdi_devices field
    CDI = "cdi"  # like cdi-cri, for CDI specs the agent writes itself (nodeagent.cdi)

    @property
    def is_cdi(self) -> bool:
        """Whether this strategy names devices through CDI."""
        return self in (
            DeviceListStrategy.CDI_ANNOTATIONS,
            DeviceListStrategy.CDI_CRI,
            DeviceListStrategy.CDI,
        )


def _replica_devices(value: Any) -> Literal["all"] | int | tuple[str, ...]:
    """NVIDIA's ``devices``: ``all``, a count of GPUs, or a list of indices / UUIDs."""
    if value == "all":
        return "all"
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ValueError(f"a count of devices must be at least 1, got {value}")
        return value
    if isinstance(value, list | tuple) and value:
        refs = []
        for item in value:
            if isinstance(item, bool) or not isinstance(item, int | str):
                raise ValueError(f"{item!r} is not a GPU index or UUID")
            ref = str(item)
            if not _DEVICE_REF.match(ref):
                raise ValueError(f"{ref!r} is not a GPU index, MIG index (0:1) or UUID")
            refs.append(ref)
        return tuple(refs)
    raise ValueError("expected `all`, a count, or a list of GPU indices / UUIDs")


def _one_or_many(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


class NvidiaSharedResource(Schema):
    """One entry of NVIDIA's ``sharing.<strategy>.resources`` list."""

    name: str = Field(
        "nvidia.com/gpu", description="resource the replicas apply to (nvidia.com/gpu, mig-...)"
    )
    replicas: int = Field(
        2,
        ge=2,
        le=MAX_REPLICAS,
        description=f"devices advertised per physical device; NVIDIA requires at least 2 "
        f"(at most {MAX_MPS_REPLICAS} under mps)",
    )
    rename: str | None = Field(
        None, description="advertise under this name; only `<name>.shared` is supported"
    )
    devices: Annotated[
        Literal["all"] | int | tuple[str, ...], BeforeValidator(_replica_devices)
    ] = Field(
        "all",
        description='"all", a count, or GPU indices/UUIDs; an index the node lacks stops '
        "the agent at start",
        json_schema_extra={"type": "all, a count, or a list of GPU indices / UUIDs"},
    )

    @field_validator("name")
    @classmethod
    def _nvidia_resource(cls, name: str) -> str:
        if not name.startswith(RESOURCE_PREFIX):
            raise ValueError(f"resource name {name!r} must start with {RESOURCE_PREFIX}")
        return name

    @model_validator(mode="after")
    def _supported_rename(self) -> Self:
        if self.rename is not None and self.rename != self.name + SHARED_SUFFIX:
            found = FieldError()
            found.add(
                "rename",
                f"rename {self.rename!r} for {self.name} is not supported; "
                f"use {self.name + SHARED_SUFFIX!r} or renameByDefault",
            )
            raise found
        return self

    def covers(self, index: int, uuid: str, position: int) -> bool:
        """Whether this entry applies to the GPU (``position``: its rank among the GPUs)."""
        if self.devices == "all":
            return True
        if isinstance(self.devices, int):
            return position < self.devices
        wanted = {str(d) for d in self.devices}
        return str(index) in wanted or uuid in wanted


class NvidiaSharingStrategy(Schema):
    """NVIDIA's ``sharing.timeSlicing`` or ``sharing.mps`` block."""

    rename_by_default: bool = Field(
        False, alias="renameByDefault", description="advertise every shared resource as .shared"
    )
    fail_requests_greater_than_one: bool | None = Field(
        None,
        alias="failRequestsGreaterThanOne",
        description="None: NVIDIA's default (false for time-slicing, true for MPS)",
    )
    resources: tuple[NvidiaSharedResource, ...] = Field(
        (), description="the resources to share and how many replicas each"
    )


class NvidiaSharing(Schema):
    """NVIDIA's ``sharing`` block; MPS wins when both strategies name a resource (as NVIDIA)."""

    time_slicing: NvidiaSharingStrategy | None = Field(
        None, alias="timeSlicing", description="time-slicing, in NVIDIA's shape"
    )
    mps: NvidiaSharingStrategy | None = Field(None, description="MPS, in NVIDIA's shape")

    @model_validator(mode="after")
    def _mps_client_limit(self) -> Self:
        found = FieldError()
        for i, entry in enumerate(self.mps.resources if self.mps is not None else ()):
            if entry.replicas > MAX_MPS_REPLICAS:
                found.add(
                    ("mps", "resources", i, "replicas"),
                    f"at most {MAX_MPS_REPLICAS} under mps (an MPS server's client limit), "
                    f"got {entry.replicas}",
                )
        found.raise_any()
        return self

    def sharing_for(self, resource: str, index: int, uuid: str, position: int) -> Sharing | None:
        """The sharing this block gives one GPU's devices of ``resource``, or None if none."""
        for mode, strategy in (
            (SharingMode.MPS, self.mps),
            (SharingMode.TIME_SLICING, self.time_slicing),
        ):
            if strategy is None:
                continue
            for entry in strategy.resources:
                if entry.name != resource or not entry.covers(index, uuid, position):
                    continue
                fail = strategy.fail_requests_greater_than_one
                return Sharing(
                    mode=mode,
                    replicas=entry.replicas,
                    rename_shared=strategy.rename_by_default or entry.rename is not None,
                    fail_requests_greater_than_one=(
                        fail if fail is not None else mode is SharingMode.MPS
                    ),
                )
        return None

    def gpu_indices(self) -> list[tuple[tuple[str | int, ...], str]]:
        """Every GPU index a ``devices`` list names, with its place (for the check at start)."""
        out: list[tuple[tuple[str | int, ...], str]] = []
        for key, strategy in (("timeSlicing", self.time_slicing), ("mps", self.mps)):
            for i, entry in enumerate(strategy.resources if strategy is not None else ()):
                if isinstance(entry.devices, tuple):
                    for j, ref in enumerate(entry.devices):
                        index = ref.split(":", 1)[0]
                        if index.isdigit():
                            out.append(((key, "resources", i, "devices", j), index))
        return out


class MpsSection(Schema):
    """The MPS control daemons the plugin runs for GPUs shared through MPS."""

    control_binary: Path = Field(
        Path("nvidia-cuda-mps-control"), description="looked up on PATH when relative"
    )
    root: Path = Field(
        Path("/run/nodeagent/mps"),
        description="per GPU: <root>/<uuid>/pipe and <root>/<uuid>/log",
    )
    shm_dir: Path = Field(
        Path("/dev/shm"), description="host shared memory mounted at /dev/shm in MPS containers"
    )
    container_pipe_root: Path = Field(
        Path("/mps"), description="where the pipe dir appears in the container"
    )
    start_timeout_s: float = Field(
        10.0,
        ge=0.1,
        le=600,
        description="seconds for a daemon to answer before the GPU is withheld",
    )
    check_interval_s: float = Field(
        2.0, ge=0.1, le=3600, description="seconds between liveness checks of running daemons"
    )


class DevicePluginSection(Schema):
    """How GPUs are advertised to the kubelet."""

    ordered = (("register_retry_initial_s", "register_retry_max_s"),)

    enabled: bool = Field(True, description="serve the device plugin to the kubelet")
    kubelet_dir: Path = Field(
        Path("/var/lib/kubelet/device-plugins"), description="--kubelet-dir overrides it"
    )
    mig_strategy: MigStrategy = Field(
        MigStrategy.NONE, description="none | single | mixed (NVIDIA's strategies)"
    )
    device_list_strategy: Annotated[
        tuple[DeviceListStrategy, ...], BeforeValidator(_one_or_many)
    ] = Field(
        (DeviceListStrategy.ENVVAR,),
        min_length=1,
        description="one strategy or a list: envvar | volume-mounts | cdi-annotations | "
        "cdi-cri | cdi",
    )
    cdi_annotation_prefix: str = Field(
        "cdi.k8s.io/", description="annotation key prefix for cdi-annotations"
    )
    cdi_kind: str = Field(
        "k8s.device-plugin.nvidia.com/gpu",
        description="CDI vendor/class; names are <kind>=<id>",
    )
    cdi_spec_dir: Path = Field(
        Path("/var/run/cdi"), description="where the cdi strategy writes its CDI specs"
    )
    cdi_spec_kind: str = Field(
        "k8s.device-plugin.nodeagent.io/gpu",
        description="CDI vendor/class of the specs the cdi strategy writes",
    )
    pass_device_specs: bool = Field(
        False, description="also return /dev/nvidia* DeviceSpecs (CPU manager compat)"
    )
    dev_root: Path = Field(
        Path("/dev"), description="where the NVIDIA device nodes live on the host"
    )
    allocate_front: Path | None = Field(
        None,
        description="nodeagent-device-plugin-front, to answer Allocate outside Python; "
        "unset: the agent answers it",
    )
    fail_on_init_error: bool = Field(
        True, description="False: a node without GPUs idles instead of crashing"
    )
    health_recovery_quiet_s: float = Field(
        60.0, ge=0, le=86400, description="seconds a cleared fault must stay clear"
    )
    register_retry_initial_s: float = Field(
        0.2, ge=0.01, le=60, description="first registration retry delay, doubled up to max"
    )
    register_retry_max_s: float = Field(
        30.0, ge=0.01, le=3600, description="cap of the registration retry delay"
    )
    mps: MpsSection = Field(default_factory=MpsSection)
    sharing: NvidiaSharing | None = Field(
        None, description="NVIDIA-shaped sharing (timeSlicing, mps); see docs/device-plugin.md"
    )

    @field_validator("cdi_annotation_prefix")
    @classmethod
    def _prefix_ends_with_slash(cls, prefix: str) -> str:
        if not prefix.endswith("/"):
            raise ValueError(f"must end with '/', got {prefix!r}")
        return prefix

    @field_validator("cdi_kind", "cdi_spec_kind")
    @classmethod
    def _vendor_slash_class(cls, kind: str) -> str:
        if "/" not in kind or "=" in kind:
            raise ValueError(f"must look like vendor.com/class, got {kind!r}")
        return kind

    @property
    def strategies(self) -> tuple[DeviceListStrategy, ...]:
        """The device list strategies (a single value in YAML becomes one entry)."""
        return self.device_list_strategy
