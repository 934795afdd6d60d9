"""Frozen domain types returned by :mod:`nodeagent.gpu`.

Everything above the GPU layer (MIG planner, device plugin, health, exporter) speaks these types
and never sees an NVML handle or a ctypes struct. Units are in the field names; a value NVML
reports as NOT_SUPPORTED is ``None``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class LinkKind(enum.StrEnum):
    """How two GPUs are connected, in the vocabulary of ``nvidia-smi topo -m``."""

    SELF = "X"
    NVLINK = "NV"  # with a link count, shown as NV<n>
    PCIE_SINGLE = "PIX"  # at most one PCIe bridge between them
    PCIE_MULTIPLE = "PXB"  # several PCIe bridges, no host bridge
    PCIE_HOSTBRIDGE = "PHB"  # through a PCIe host bridge
    NODE = "NODE"  # across host bridges within one NUMA node
    SYSTEM = "SYS"  # across NUMA nodes (the SMP interconnect)


@dataclass(frozen=True, slots=True)
class Link:
    """The connection between two GPUs."""

    kind: LinkKind
    nvlink_count: int = 0  # number of active NVLinks between the pair (0 unless kind is NVLINK)

    @property
    def label(self) -> str:
        """The cell ``nvidia-smi topo -m`` prints for this pair (``NV18``, ``PIX``, ``SYS``...)."""
        if self.kind is LinkKind.NVLINK:
            return f"NV{self.nvlink_count}"
        return self.kind.value


@dataclass(frozen=True, slots=True)
class Placement:
    """A GPU-instance placement in memory-slice units (NVML ``nvmlGpuInstancePlacement_t``)."""

    start: int
    size: int

    @property
    def end(self) -> int:
        """One past the last memory slice occupied."""
        return self.start + self.size

    def overlaps(self, other: Placement) -> bool:
        """Whether the two placements share a memory slice."""
        return self.start < other.end and other.start < self.end


@dataclass(frozen=True, slots=True)
class MigSlot:
    """A MIG profile at a placement: what a layout, a plan and a report are made of.

    The one label format (``3g.40gb@4:4``: profile, start slice, size) is for people; JSON
    carries the fields (:meth:`to_json`).
    """

    profile: str  # e.g. "3g.40gb"
    placement: Placement

    @property
    def label(self) -> str:
        """``3g.40gb@4:4``: profile, start slice and size."""
        return f"{self.profile}@{self.placement.start}:{self.placement.size}"

    def to_json(self) -> dict[str, str | int]:
        """``{"profile": "3g.40gb", "start": 4, "size": 4}``."""
        return {
            "profile": self.profile,
            "start": self.placement.start,
            "size": self.placement.size,
        }


@dataclass(frozen=True, slots=True)
class MigProfile:
    """A GPU-instance profile as the device reports it.

    ``profile_id`` is NVML's device-specific profile ID (what ``nvidia-smi mig -lgip`` prints and
    what create/placement calls take); ``nvml_index`` is the ``NVML_GPU_INSTANCE_PROFILE_*``
    constant used to query it. They are different integer spaces.
    """

    name: str  # e.g. "1g.10gb", "1g.10gb+me"
    profile_id: int
    nvml_index: int
    slices: int  # memory slices occupied (placement size)
    compute_slices: int  # the "g" in the name: SM slices of 7 (or 4 on A30)
    multiprocessors: int
    memory_bytes: int
    max_count: int
    copy_engines: int
    decoders: int
    jpeg_decoders: int
    ofa: int
    placements: tuple[Placement, ...]  # every legal placement, whether free or not


class GeometrySource(enum.StrEnum):
    """Where a GPU's MIG geometry was read."""

    DRIVER = "driver"  # NVML's profile info and placements
    # nodeagent.migcatalog, by PCI device ID and memory: NVML answers profile info only while
    # MIG is enabled (nvml.h), and a layout must be planned before MIG is turned on
    CATALOG = "catalog"


@dataclass(frozen=True, slots=True)
class MigGeometry:
    """The MIG layout rules of one GPU model: enough for the planner to reason without NVML."""

    model: str  # product name, e.g. "NVIDIA H100 80GB HBM3"
    memory_slices: int  # 8 on A100/H100/H200, 4 on A30
    profiles: tuple[MigProfile, ...]
    source: GeometrySource = GeometrySource.DRIVER

    def profile(self, name: str) -> MigProfile | None:
        """The profile with this name, or ``None`` when the model does not offer it."""
        for candidate in self.profiles:
            if candidate.name == name:
                return candidate
        return None


@dataclass(frozen=True, slots=True)
class ComputeInstance:
    """A compute instance inside a GPU instance. A CI is what CUDA calls a MIG device."""

    gpu_instance_id: int
    instance_id: int
    profile_id: int  # NVML_COMPUTE_INSTANCE_PROFILE_* value
    slice_count: int
    placement: Placement  # SM-slice units, relative to the GPU instance
    uuid: str  # MIG-... UUID of the MIG device this CI forms


@dataclass(frozen=True, slots=True)
class Profiling:
    """Profiling figures of a GPU or of one MIG GPU instance over one sampling interval.

    Computed by NVML's GPM (``nvmlGpmMetricsGet``, Hopper and later) from two samples taken
    ``interval_s`` apart: what DCGM exports as ``DCGM_FI_PROF_*``. Ratios are 0..1 (NVML gives
    percent); rates are bytes per second (NVML gives MiB/s). A figure NVML did not compute for
    this device or instance (PCIe and NVLink on a MIG instance, for one) is ``None``, never 0.
    A GPU or instance without GPM has no ``Profiling`` at all.
    """

    interval_s: float  # time between the two GPM samples the figures were computed from
    graphics_active_ratio: float | None  # GRAPHICS_UTIL: any graphics/compute engine busy
    sm_active_ratio: float | None  # SM_UTIL: share of SMs busy
    sm_occupancy_ratio: float | None  # SM_OCCUPANCY: resident warps vs the theoretical maximum
    tensor_active_ratio: float | None  # ANY_TENSOR_UTIL: any tensor pipe busy
    dram_active_ratio: float | None  # DRAM_BW_UTIL: DRAM bandwidth used vs the peak
    fp64_active_ratio: float | None  # FP64_UTIL (non-tensor)
    fp32_active_ratio: float | None  # FP32_UTIL (non-tensor)
    fp16_active_ratio: float | None  # FP16_UTIL (non-tensor)
    pcie_tx_bytes_per_second: float | None  # PCIE_TX_PER_SEC: from the GPU
    pcie_rx_bytes_per_second: float | None  # PCIE_RX_PER_SEC: to the GPU
    nvlink_tx_bytes_per_second: float | None  # NVLINK_TOTAL_TX_PER_SEC, all links
    nvlink_rx_bytes_per_second: float | None  # NVLINK_TOTAL_RX_PER_SEC, all links


@dataclass(frozen=True, slots=True)
class GpuInstance:
    """A GPU instance with its compute instances and the processes running on it."""

    gpu_index: int
    instance_id: int  # per-device GI ID (``-lgi`` "Instance ID"); unrelated to profile_id
    profile: str  # profile name, e.g. "3g.40gb"
    profile_id: int
    placement: Placement
    compute_instances: tuple[ComputeInstance, ...]
    pids: tuple[int, ...]  # processes running on any of its compute instances
    # GPM figures of this instance (nvmlGpmMigSampleGet) in a snapshot; None where GPM is
    # absent, profiling is off, or outside a snapshot (MIG calls). Not part of the instance's
    # identity: two reads of the same layout compare equal whatever the load.
    profiling: Profiling | None = field(default=None, compare=False)

    @property
    def busy(self) -> bool:
        """Whether any process runs on this instance (destroying it would kill work)."""
        return bool(self.pids)

    @property
    def uuid(self) -> str | None:
        """UUID of the instance's first MIG device, or ``None`` when it has no compute instance."""
        return self.compute_instances[0].uuid if self.compute_instances else None

    @property
    def slot(self) -> MigSlot:
        """Its profile and placement."""
        return MigSlot(self.profile, self.placement)


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """Static facts about one physical GPU."""

    index: int
    uuid: str
    name: str
    serial: str | None
    pci_bus_id: str  # "00000000:18:00.0"
    pci_device_id: int  # combined device/vendor id, e.g. 0x233010DE
    numa_node: int | None
    memory_total_bytes: int
    compute_capability: tuple[int, int]
    driver_version: str
    cuda_driver_version: str  # "12.8"
    vbios_version: str | None
    mig_capable: bool
    mig_enabled: bool  # current mode
    mig_pending: bool  # the requested mode; differs from mig_enabled while a change is pending
    minor_number: int | None = None

    @property
    def mig_change_pending(self) -> bool:
        """A mode change is pending (current and pending modes differ): its activation failed,
        or the driver waits for a reset."""
        return self.mig_enabled != self.mig_pending


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """A compute process on a GPU (or on a MIG instance of it)."""

    pid: int
    used_memory_bytes: int | None
    gpu_instance_id: int | None  # None on a GPU without MIG
    compute_instance_id: int | None
    # Read with the snapshot's telemetry (the MIG paths list processes without them):
    name: str | None = None  # command name (nvmlSystemGetProcessName); None: not known
    # Share of the sampling period the process's kernels ran on the SMs, and its share of the
    # memory controller's busy time (0..1; NVML's process utilization samples since the last
    # snapshot, averaged). 0 when NVML kept no sample of it (it ran nothing); None where NVML
    # keeps none (MIG, older GPUs).
    sm_utilization_ratio: float | None = None
    memory_utilization_ratio: float | None = None
    mps_client: bool = False  # a client of the GPU's MPS server


@dataclass(frozen=True, slots=True)
class EccCounts:
    """ECC error counts (NVML totals: corrected = single-bit, uncorrected = double-bit)."""

    volatile_corrected: int
    volatile_uncorrected: int
    aggregate_corrected: int
    aggregate_uncorrected: int


@dataclass(frozen=True, slots=True)
class RemappedRows:
    """Row-remapping state (A100 and newer)."""

    correctable: int
    uncorrectable: int
    pending: bool
    failure: bool


@dataclass(frozen=True, slots=True)
class NvLinkStatus:
    """One NVLink of a GPU: whether it is up and its data-link error counters."""

    link: int
    active: bool
    replay_errors: int | None
    recovery_errors: int | None
    crc_flit_errors: int | None


class ClockEventReason(enum.IntFlag):
    """Why the GPU's clocks are where they are: NVML's ``nvmlClocksEventReason*`` bits.

    Decoded once here; the exporter shows every member as a series, the health checks react to
    the slowdowns. Bits a newer driver adds stay in the value (``IntFlag`` keeps unknown bits).
    """

    GPU_IDLE = 0x1
    APPLICATIONS_CLOCKS = 0x2  # clocks set by the applications-clocks setting
    SW_POWER_CAP = 0x4  # the power cap (software) holds the clocks down
    HW_SLOWDOWN = 0x8  # hardware slowdown: thermal, power brake or an external signal
    SYNC_BOOST = 0x10  # clocks synchronised with other GPUs of a sync-boost group
    SW_THERMAL_SLOWDOWN = 0x20  # the driver lowers clocks to stay under the thermal limit
    HW_THERMAL_SLOWDOWN = 0x40  # the GPU itself slows down: it is too hot
    HW_POWER_BRAKE_SLOWDOWN = 0x80  # an external power brake (the power supply) slows it
    DISPLAY_CLOCKS = 0x100  # display clock settings

    @property
    def label(self) -> str:
        """The reason's name as exported (``hw_slowdown``); only for single-bit members."""
        return (self.name or "").lower()


@dataclass(frozen=True, slots=True)
class Telemetry:
    """One sample of a GPU's moving values and health counters.

    ``clock_event_reasons`` is NVML's bitmask, decoded (:class:`ClockEventReason`).
    """

    gpu_index: int
    timestamp_s: float  # time.time() when sampled
    utilization_gpu_ratio: float | None  # 0..1
    utilization_memory_ratio: float | None  # 0..1
    # Memory as nvidia-smi shows it (NVML memory info v2): used is what processes allocated,
    # reserved what the driver and firmware set aside; used + reserved + free is the total.
    # Where the driver has only v1, used includes the reserved memory and reserved is None.
    memory_used_bytes: int
    memory_free_bytes: int
    memory_reserved_bytes: int | None
    temperature_celsius: float | None
    temperature_slowdown_celsius: float | None
    power_watts: float | None
    power_limit_watts: float | None
    energy_joules: float | None  # total since driver load
    sm_clock_hz: float | None
    memory_clock_hz: float | None
    clock_event_reasons: ClockEventReason | None
    ecc: EccCounts | None
    remapped_rows: RemappedRows | None
    retired_pages_sbe: int | None
    retired_pages_dbe: int | None
    retired_pages_pending: bool | None
    pcie_replay_count: int | None
    nvlinks: tuple[NvLinkStatus, ...]
    processes: tuple[ProcessInfo, ...]


class EventKind(enum.StrEnum):
    """NVML event types the agent listens for."""

    XID = "xid"
    ECC_SINGLE_BIT = "ecc-sbe"
    ECC_DOUBLE_BIT = "ecc-dbe"


@dataclass(frozen=True, slots=True)
class GpuEvent:
    """An event from the NVML event set."""

    kind: EventKind
    gpu_index: int
    gpu_uuid: str
    data: int  # the XID code for XID events
    gpu_instance_id: int | None  # set when the event is attributed to a MIG GPU instance
    compute_instance_id: int | None
    timestamp_s: float


@dataclass(frozen=True, slots=True)
class GpuState:
    """Everything sampled from one GPU in one pass; ``lost`` GPUs carry only ``info``.

    ``error`` says what went wrong: why a lost GPU is lost, why there is no telemetry, or which
    readings failed (those are ``None`` in ``telemetry``, the rest were read). A lost GPU keeps
    its last known MIG layout and geometry, so its MIG devices are reported lost, not dropped.
    """

    info: GpuInfo
    telemetry: Telemetry | None
    mig_instances: tuple[GpuInstance, ...]
    lost: bool = False
    error: str | None = None
    # The MIG rules of the GPU's model while MIG is enabled (None otherwise): what capacity and
    # fragmentation are computed from, so no consumer has to ask NVML for it.
    mig_geometry: MigGeometry | None = None
    # GPM profiling of the whole GPU over the last interval; None where the GPU has no GPM
    # (before Hopper), profiling is off, or the first of the two samples is still missing.
    profiling: Profiling | None = None


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """One consistent view of the node, produced by the sampler and shared read-only."""

    timestamp_s: float
    sample_duration_s: float
    driver_version: str
    cuda_driver_version: str
    gpus: tuple[GpuState, ...]
    topology: dict[tuple[int, int], Link] = field(default_factory=dict)
    nvml_errors: dict[str, int] = field(default_factory=dict)  # errors by NVML function this pass
