"""The ``device_plugin`` section: the kubelet device plugin servers.

Sharing normally comes from the pool policy (``pools.<name>.sharing`` and ``gpu_sharing``). For
clusters moving over from NVIDIA's plugin, ``device_plugin.sharing`` also accepts NVIDIA's
``sharing.timeSlicing`` / ``sharing.mps`` shapes; unlike NVIDIA's plugin, their ``devices`` and
``rename`` fields are honoured, so one node can mix modes and replica counts per GPU.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path

from nodeagent.config.policy import Sharing, SharingMode

RESOURCE_PREFIX = "nvidia.com/"
SHARED_SUFFIX = ".shared"


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

    @property
    def is_cdi(self) -> bool:
        """Whether this strategy names devices through CDI."""
        return self in (DeviceListStrategy.CDI_ANNOTATIONS, DeviceListStrategy.CDI_CRI)


@dataclass(frozen=True, slots=True)
class NvidiaSharedResource:
    """One entry of NVIDIA's ``sharing.<strategy>.resources`` list."""

    name: str = "nvidia.com/gpu"  # resource the replicas apply to (nvidia.com/gpu, mig-...)
    replicas: int = 2  # devices advertised per physical device; NVIDIA requires at least 2
    rename: str | None = None  # advertise under this name; only `<name>.shared` is supported
    devices: int | str | tuple[int | str, ...] = "all"  # "all", a count, or indices/UUIDs

    def __post_init__(self) -> None:
        if not self.name.startswith(RESOURCE_PREFIX):
            raise ValueError(f"resource name {self.name!r} must start with {RESOURCE_PREFIX}")
        if self.replicas < 2:
            raise ValueError(
                f"replicas for {self.name} must be at least 2, got {self.replicas} "
                "(leave the resource out to keep it exclusive)"
            )
        if self.rename is not None and self.rename != self.name + SHARED_SUFFIX:
            raise ValueError(
                f"rename {self.rename!r} for {self.name} is not supported; "
                f"use {self.name + SHARED_SUFFIX!r} or renameByDefault"
            )
        if isinstance(self.devices, str) and self.devices != "all":
            raise ValueError(f"devices for {self.name} must be 'all', a count or a list")

    def covers(self, index: int, uuid: str, position: int) -> bool:
        """Whether this entry applies to the GPU (``position``: its rank among the GPUs)."""
        if self.devices == "all":
            return True
        if isinstance(self.devices, int):
            return position < self.devices
        wanted = {str(d) for d in self.devices}
        return str(index) in wanted or uuid in wanted


@dataclass(frozen=True, slots=True)
class NvidiaSharingStrategy:
    """NVIDIA's ``sharing.timeSlicing`` or ``sharing.mps`` block."""

    rename_by_default: bool = field(default=False, metadata={"key": "renameByDefault"})
    fail_requests_greater_than_one: bool | None = field(
        default=None, metadata={"key": "failRequestsGreaterThanOne"}
    )  # None: NVIDIA's default (false for time-slicing, true for MPS)
    resources: tuple[NvidiaSharedResource, ...] = ()


@dataclass(frozen=True, slots=True)
class NvidiaSharing:
    """NVIDIA's ``sharing`` block; MPS wins when both strategies name a resource (as NVIDIA)."""

    time_slicing: NvidiaSharingStrategy | None = field(
        default=None, metadata={"key": "timeSlicing"}
    )
    mps: NvidiaSharingStrategy | None = None

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


@dataclass(frozen=True, slots=True)
class MpsSection:
    """The MPS control daemons the plugin runs for GPUs shared through MPS."""

    control_binary: Path = Path("nvidia-cuda-mps-control")  # looked up on PATH when relative
    root: Path = Path("/run/nodeagent/mps")  # per GPU: <root>/<uuid>/pipe and <root>/<uuid>/log
    shm_dir: Path = Path("/dev/shm")  # host shared memory mounted at /dev/shm in MPS containers
    container_pipe_root: Path = Path("/mps")  # where the pipe dir appears in the container
    start_timeout_s: float = 10.0  # seconds for a daemon to answer before the GPU is withheld
    check_interval_s: float = 2.0  # seconds between liveness checks of running daemons

    def __post_init__(self) -> None:
        if self.start_timeout_s <= 0 or self.check_interval_s <= 0:
            raise ValueError("mps start_timeout_s and check_interval_s must be positive")


@dataclass(frozen=True, slots=True)
class DevicePluginSection:
    """How GPUs are advertised to the kubelet."""

    enabled: bool = True
    kubelet_dir: Path = Path("/var/lib/kubelet/device-plugins")  # --kubelet-dir overrides it
    mig_strategy: MigStrategy = MigStrategy.NONE  # none | single | mixed (NVIDIA's strategies)
    device_list_strategy: DeviceListStrategy | tuple[DeviceListStrategy, ...] = (
        DeviceListStrategy.ENVVAR,
    )  # one strategy or a list: envvar | volume-mounts | cdi-annotations | cdi-cri
    cdi_annotation_prefix: str = "cdi.k8s.io/"  # annotation key prefix for cdi-annotations
    cdi_kind: str = "k8s.device-plugin.nvidia.com/gpu"  # CDI vendor/class; names are <kind>=<id>
    pass_device_specs: bool = False  # also return /dev/nvidia* DeviceSpecs (CPU manager compat)
    dev_root: Path = Path("/dev")  # where the NVIDIA device nodes live on the host
    fail_on_init_error: bool = True  # False: a node without GPUs idles instead of crashing
    health_recovery_quiet_s: float = 60.0  # seconds a cleared fault must stay clear
    register_retry_initial_s: float = 0.2  # first registration retry delay, doubled up to max
    register_retry_max_s: float = 30.0  # cap of the registration retry delay
    mps: MpsSection = field(default_factory=MpsSection)
    sharing: NvidiaSharing | None = None  # NVIDIA-shaped sharing; see the module docstring

    def __post_init__(self) -> None:
        if isinstance(self.device_list_strategy, DeviceListStrategy):
            object.__setattr__(self, "device_list_strategy", (self.device_list_strategy,))
        if not self.device_list_strategy:
            raise ValueError("device_list_strategy must name at least one strategy")
        if self.health_recovery_quiet_s < 0:
            raise ValueError(
                f"health_recovery_quiet_s must be >= 0, got {self.health_recovery_quiet_s}"
            )
        if not 0 < self.register_retry_initial_s <= self.register_retry_max_s:
            raise ValueError("register_retry_initial_s must be > 0 and <= register_retry_max_s")
        if not self.cdi_annotation_prefix.endswith("/"):
            raise ValueError(
                f"cdi_annotation_prefix must end with '/', got {self.cdi_annotation_prefix!r}"
            )
        if "/" not in self.cdi_kind or "=" in self.cdi_kind:
            raise ValueError(f"cdi_kind must look like vendor.com/class, got {self.cdi_kind!r}")

    @property
    def strategies(self) -> tuple[DeviceListStrategy, ...]:
        """The device list strategies as a tuple (a single value in YAML becomes one entry)."""
        value = self.device_list_strategy
        return (value,) if isinstance(value, DeviceListStrategy) else value
