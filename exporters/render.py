"""Render one NodeSnapshot (plus health, MIG capacity and pod attribution) into exposition bytes.

Two steps. :meth:`Renderer.observe` takes in every snapshot (the counters that span snapshots,
the pod attribution and the capacity the rest of the agent acts on); :meth:`Renderer.render`
turns an observed snapshot into exposition bytes, for the snapshots a scrape may serve (the
metrics component decides which: samples come every second, scrapes every 15 to 60 s, and the
text is most of the cost). Nothing here calls NVML. The result is immutable
(:class:`Rendered`); a scrape takes a reference to it and appends the snapshot age, the only
value that depends on the moment of the scrape.
"""

from __future__ import annotations

import gzip
import logging
import platform
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from nodeagent import capacity
from nodeagent.config.pool_policy import PoolPolicy
from nodeagent.gpu.types import (
    ClockEventReason,
    GpuInstance,
    GpuState,
    NodeSnapshot,
    Profiling,
)
from nodeagent.runtime.health_source import (
    DeviceHealth,
    HealthSource,
    HealthState,
    NodeHealthSource,
)
from nodeagent.runtime.mig import MigLayoutStatus
from nodeagent.workloads import (
    AttributedProcess,
    CgroupReader,
    Device,
    PodIndex,
    SharedDevice,
    Workload,
    WorkloadUsage,
    attribute,
    shared_devices,
    usage_by_workload,
)
from nodeagent_exporters import dcgm_compat
from nodeagent_exporters.catalog import (
    MIG_PROFILING,
    PROFILING,
    WORKLOAD_PROFILING,
    Kind,
    ProfilingFigure,
    spec,
)
from nodeagent_exporters.podresources import Allocations, PodDevice
from nodeagent_exporters.probe import ProbeRunner

log = logging.getLogger(__name__)

# One series per clocks-event reason, so alerts can pick the reasons that matter (hw_slowdown,
# hw_thermal_slowdown, hw_power_brake_slowdown) by label.
CLOCK_EVENT_REASONS = tuple(ClockEventReason)
STABILITY_LEVELS = ("stable", "degraded", "unstable", "unknown")


@dataclass(frozen=True, slots=True)
class NodeCapacity:
    """The node's capacity summary of one snapshot (also published as node annotations)."""

    mig_fragmentation_mean: float | None  # mean fragmentation ratio over MIG GPUs; None: none
    stranded_mig_slices: int  # free slices no requested profile can use, over all GPUs
    stranded_gpus: int  # free whole GPUs no whole-GPU request size can use
    free_gpus: int  # free whole GPUs


@dataclass(frozen=True, slots=True)
class Rendered:
    """Exposition bytes of one snapshot, plain and gzip-compressed."""

    body: bytes
    gzipped: bytes
    snapshot_timestamp_s: float
    generation: int = 0
    capacity: NodeCapacity | None = None


@dataclass(frozen=True, slots=True)
class _Observed:
    """What :meth:`Renderer.observe` computed of one snapshot, for its render."""

    snapshot: NodeSnapshot
    capacity: NodeCapacity
    gpu_fragmentation: Mapping[int, tuple[float, int]]  # MIG GPU -> (ratio, stranded slices)
    largest_free_nvlink_set: int  # GPUs in the largest NVLink-connected set of free GPUs


def version() -> str:
    """The installed nodeagent version ("unknown" when run from an uninstalled tree)."""
    try:
        return metadata.version("nodeagent")
    except metadata.PackageNotFoundError:
        return "unknown"


_AGE_HEADER = (
    "# HELP nodeagent_snapshot_age_seconds {help}\n# TYPE nodeagent_snapshot_age_seconds gauge\n"
).format(help=spec("nodeagent_snapshot_age_seconds").help)


def age_lines(rendered: Rendered, now: float) -> bytes:
    """The per-scrape tail: the snapshot's age (never negative under clock steps)."""
    age = max(0.0, now - rendered.snapshot_timestamp_s)
    return f"{_AGE_HEADER}nodeagent_snapshot_age_seconds {age:.3f}\n".encode()


def _family(name: str) -> GaugeMetricFamily | CounterMetricFamily:
    s = spec(name)
    if s.kind is Kind.COUNTER:
        return CounterMetricFamily(name, s.help, labels=list(s.labels))
    return GaugeMetricFamily(name, s.help, labels=list(s.labels))


Sample = tuple[tuple[str, ...], float]


class _Families:
    """The samples of one render, grouped by family in the order they were added."""

    def __init__(self) -> None:
        self.samples: dict[str, list[Sample]] = {}

    def add(self, name: str, labels: Sequence[str], value: float | None) -> None:
        """Add one sample; ``None`` (NOT_SUPPORTED) is left out rather than exported as NaN."""
        if value is None:
            return
        family = self.samples.get(name)
        if family is None:
            family = self.samples[name] = []
        family.append((tuple(labels), float(value)))


class _OneFamily:
    """A collector yielding one prepared family: the unit ``generate_latest`` renders here."""

    def __init__(self) -> None:
        self.family: Metric | None = None

    def collect(self) -> Iterator[Metric]:
        """What the registry asks for when generating the exposition."""
        if self.family is not None:
            yield self.family


class _FamilyCache:
    """Exposition bytes per family, reused while the family's samples are unchanged.

    Most families hold still between snapshots (inventory, MIG layout, NVLink and ECC counters,
    pod attribution); formatting is what costs, so only the families whose samples changed go
    through ``generate_latest`` again. The output is byte-identical to rendering all at once.
    """

    def __init__(self) -> None:
        self._bytes: dict[str, tuple[tuple[Sample, ...], bytes]] = {}
        self._collector = _OneFamily()
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(self._collector)

    def render(self, families: _Families) -> bytes:
        """The exposition of every family, in the order they were added."""
        out = []
        fresh: dict[str, tuple[tuple[Sample, ...], bytes]] = {}
        for name, samples in families.samples.items():
            key = tuple(samples)
            cached = self._bytes.get(name)
            if cached is not None and cached[0] == key:
                fresh[name] = cached
            else:
                family = _family(name)
                for labels, value in samples:
                    family.add_metric(list(labels), value)
                self._collector.family = family
                fresh[name] = (key, generate_latest(self._registry))
            out.append(fresh[name][1])
        self._collector.family = None
        self._bytes = fresh  # families that vanished are dropped with the old dict
        return b"".join(out)


def _bool(value: bool | None) -> float | None:
    return None if value is None else float(value)


def _mig_mode(gpu: GpuState) -> str:
    info = gpu.info
    if not info.mig_capable:
        return "unsupported"
    if info.mig_change_pending:
        return "pending-enable" if info.mig_pending else "pending-disable"
    return "enabled" if info.mig_enabled else "disabled"


@dataclass
class Sources:
    """Where the renderer reads everything besides the snapshot; each is read once per render.

    Callables rather than values because the config reloads (SIGHUP), the health component may
    start after the exporter, and the poller replaces its attribution in the background.
    """

    policy: Callable[[], PoolPolicy]
    health: Callable[[], HealthSource | None] = lambda: None
    allocations: Callable[[], Allocations | None] = lambda: None
    # The agent's own device plugin: resource -> {device ID: healthy}; None when it is off.
    advertised: Callable[[], Mapping[str, Mapping[str, bool]] | None] = lambda: None
    restarts: Mapping[str, int] = field(default_factory=dict)
    pool: Callable[[], str] = lambda: "default"
    # The MIG reconciler's last round; None when the agent manages no layout.
    mig: Callable[[], MigLayoutStatus | None] = lambda: None
    started_at_s: float | None = None  # when the agent started (counters restart then)
    # Process attribution: the cgroup reader (None: off) and the pods of this node.
    cgroups: CgroupReader | None = None
    pod_index: Callable[[], PodIndex | None] = lambda: None
    max_workload_series: int = 1000
    probe: Callable[[], ProbeRunner | None] = lambda: None
    # Application XIDs by (device, workload, code), from the health feature's attributor.
    app_xids: AppXids = dict
    # Remediation steps by (GPU index, UUID, step, result), and whether each GPU's last
    # validation passed (UUID -> bool), from the health feature's validator.
    remediation_steps: StepCounts = dict
    validations: Callable[[], Mapping[str, bool]] = dict
    # The Hostname label of the dcgm-exporter compatibility view (metrics.dcgm_compat), or
    # None while the view is off.
    dcgm_compat: Callable[[], str | None] = lambda: None


AppXids = Callable[[], Mapping[tuple[Device, Workload, int], int]]
StepCounts = Callable[[], Mapping[tuple[int, str, str, str], int]]


def _profiling(
    f: _Families,
    prefix: str,
    figures: tuple[ProfilingFigure, ...],
    labels: tuple[str, ...],
    profiling: Profiling | None,
) -> None:
    """The GPM figures of one device; nothing at all where it has none (no GPM, first pass)."""
    if profiling is None:
        return
    for figure in figures:
        f.add(prefix + figure.suffix, labels, getattr(profiling, figure.field))


def _opt_flag(value: bool | None) -> float | None:
    return None if value is None else float(value)


def _device_labels(d: Device) -> tuple[str, str, str, str]:
    """gpu, uuid (the GPU's, as on every MIG metric), mig_profile, mig_instance."""
    instance = "" if d.mig_instance is None else str(d.mig_instance)
    return (str(d.gpu_index), d.gpu_uuid, d.mig_profile or "", instance)


@dataclass(frozen=True, slots=True)
class _WorkloadView:
    """What one set of inputs gives: attributed processes, rows, shared devices."""

    key: object
    processes: tuple[AttributedProcess, ...]
    unattributed: tuple[tuple[tuple[str, str, str, str], int], ...]
    rows: tuple[WorkloadUsage, ...]
    dropped: int
    shared: tuple[SharedDevice, ...]


def _workload_view(
    key: object,
    snap: NodeSnapshot,
    holders: Sequence[PodDevice],
    cgroups: CgroupReader,
    index: PodIndex | None,
    cap: int,
) -> _WorkloadView:
    processes = attribute(snap, holders, cgroups, index)
    cgroups.retain(p.process.pid for p in processes)
    # Every device that answered gets a series, so "nothing unattributed" reads 0.
    per_device: dict[tuple[str, str, str, str], int] = {}
    for g in snap.gpus:
        if g.telemetry is None:
            continue
        if not g.info.mig_enabled:
            per_device[(str(g.info.index), g.info.uuid, "", "")] = 0
        for gi in g.mig_instances:
            per_device[(str(g.info.index), g.info.uuid, gi.profile, str(gi.instance_id))] = 0
    for p in processes:
        if p.workload is None or not p.workload.named:
            ids = _device_labels(p.device)
            per_device[ids] = per_device.get(ids, 0) + (p.process.used_memory_bytes or 0)
    rows = usage_by_workload(processes)
    kept = rows
    if len(rows) > cap:
        biggest = set(sorted(rows, key=lambda r: -r.memory_used_bytes)[:cap])
        kept = tuple(r for r in rows if r in biggest)
    return _WorkloadView(
        key,
        processes,
        tuple(sorted(per_device.items())),
        kept,
        len(rows) - len(kept),
        shared_devices(snap, processes),
    )


class Renderer:
    """Observes every snapshot and renders the ones asked for into :class:`Rendered`."""

    def __init__(self, sources: Sources, *, clock: Callable[[], float] = time.time) -> None:
        self.sources = sources
        self._clock = clock
        self._nvml_errors: dict[str, int] = {}
        self._last_render_s = 0.0
        self._version = version()
        self._python = platform.python_version()
        self.renders = 0
        self._cache = _FamilyCache()
        # The processes of the last render with their pods (read by the CLI and the tests).
        self.processes: tuple[AttributedProcess, ...] = ()
        self.shared: tuple[SharedDevice, ...] = ()  # devices several workloads use
        self._workload_view: _WorkloadView | None = None
        self._observed: _Observed | None = None

    def observe(self, snapshot: NodeSnapshot) -> NodeCapacity:
        """Take in ``snapshot``: NVML error counts, pod attribution, capacity (once each).

        Called for every snapshot, so that counters miss no pass and :attr:`processes`,
        :attr:`shared` and the capacity stay current whether or not anyone scrapes.
        """
        return self._observation(snapshot).capacity

    def _observation(self, snapshot: NodeSnapshot) -> _Observed:
        if self._observed is not None and self._observed.snapshot is snapshot:
            return self._observed
        for function, count in snapshot.nvml_errors.items():
            self._nvml_errors[function] = self._nvml_errors.get(function, 0) + count
        allocations = self.sources.allocations()
        self._attribute(snapshot, allocations)
        self._observed = self._capacity(snapshot, allocations)
        return self._observed

    def render(self, snapshot: NodeSnapshot, generation: int = 0) -> Rendered:
        """Render ``snapshot`` (observed first if it was not)."""
        started = time.perf_counter()
        observed = self._observation(snapshot)
        families = _Families()
        self._fill(families, observed)
        families.add("nodeagent_render_duration_seconds", (), self._last_render_s)
        body = self._cache.render(families)
        hostname = self.sources.dcgm_compat()
        if hostname is not None:  # the same snapshot in dcgm-exporter's names
            health, allocations = self.sources.health(), self.sources.allocations()
            body += dcgm_compat.render(snapshot, hostname, health, allocations)
        self._last_render_s = time.perf_counter() - started
        self.renders += 1
        # Level 1: a 2x smaller body for a fraction of the cost of level 6, once per render.
        return Rendered(
            body, gzip.compress(body, 1), snapshot.timestamp_s, generation, observed.capacity
        )

    def _device_health(self) -> dict[str, DeviceHealth]:
        source = self.sources.health()
        return dict(source.device_health()) if source is not None else {}

    def _capacity(self, snap: NodeSnapshot, allocations: Allocations | None) -> _Observed:
        """Free and stranded GPUs, and each MIG GPU's fragmentation, of one snapshot."""
        policy = self.sources.policy()
        health = self._device_health()
        allocated = {d.uuid for d in allocations.pod_devices} if allocations is not None else set()
        free_gpus: list[int] = []
        per_gpu: dict[int, tuple[float, int]] = {}
        for gpu in snap.gpus:
            if gpu.info.mig_enabled and not gpu.lost:
                geometry = gpu.mig_geometry
                if geometry is not None:
                    per_gpu[gpu.info.index] = (
                        capacity.fragmentation_ratio(geometry, gpu.mig_instances),
                        capacity.stranded_slices(geometry, gpu.mig_instances, policy.request_sizes),
                    )
            elif self._is_free(gpu, health.get(gpu.info.uuid), allocated):
                free_gpus.append(gpu.info.index)
        components = capacity.nvlink_components(free_gpus, snap.topology)
        ratios = [ratio for ratio, _ in per_gpu.values()]
        node = NodeCapacity(
            mig_fragmentation_mean=sum(ratios) / len(ratios) if ratios else None,
            stranded_mig_slices=sum(stranded for _, stranded in per_gpu.values()),
            stranded_gpus=capacity.stranded_gpus(components, policy.request_sizes),
            free_gpus=len(free_gpus),
        )
        return _Observed(snap, node, per_gpu, components[0] if components else 0)

    # --- families ----------------------------------------------------------------------------
    def _fill(self, f: _Families, observed: _Observed) -> None:
        snap = observed.snapshot
        policy = self.sources.policy()
        health_source = self.sources.health()
        health = self._device_health()
        allocations = self.sources.allocations()
        self._inventory(f, snap, policy)
        mig_by_uuid: dict[str, tuple[GpuState, GpuInstance]] = {}
        for gpu in snap.gpus:
            ids = (str(gpu.info.index), gpu.info.uuid)
            self._telemetry(f, gpu, ids)
            _profiling(f, "nodeagent_gpu_prof_", PROFILING, ids, gpu.profiling)
            self._health(f, gpu, ids, health.get(gpu.info.uuid))
            for gi in gpu.mig_instances:
                for ci in gi.compute_instances:
                    mig_by_uuid[ci.uuid] = (gpu, gi)
            if gpu.info.mig_enabled and not gpu.lost:
                self._mig(f, gpu, ids, health, observed.gpu_fragmentation.get(gpu.info.index))
        f.add("nodeagent_free_gpus", (), observed.capacity.free_gpus)
        f.add("nodeagent_free_nvlink_set_gpus", (), observed.largest_free_nvlink_set)
        f.add("nodeagent_stranded_gpus", (), observed.capacity.stranded_gpus)
        self._xids_and_stability(f, snap, health_source)
        self._mig_layout(f, snap, self.sources.mig())
        self._device_plugin(f, snap, allocations, self.sources.advertised(), mig_by_uuid)
        self._workloads(f, snap)
        self._remediation(f, snap)
        self._agent(f, snap)

    def _inventory(self, f: _Families, snap: NodeSnapshot, policy: PoolPolicy) -> None:
        f.add("nodeagent_gpus", (), len(snap.gpus))
        f.add("nodeagent_node_pool_info", (self.sources.pool(),), 1)
        f.add("nodeagent_driver_info", (snap.driver_version, snap.cuda_driver_version), 1)
        expected = policy.expected_driver_version
        drift = expected is not None and expected != snap.driver_version
        f.add("nodeagent_driver_drift", (snap.driver_version, expected or ""), float(drift))
        for gpu in snap.gpus:
            i = gpu.info
            labels = (
                str(i.index),
                i.uuid,
                i.name,
                i.pci_bus_id,
                i.driver_version,
                i.cuda_driver_version,
                i.vbios_version or "",
                _mig_mode(gpu),
            )
            f.add("nodeagent_gpu_info", labels, 1)
            f.add("nodeagent_gpu_lost", (str(i.index), i.uuid), float(gpu.lost))

    def _telemetry(self, f: _Families, gpu: GpuState, ids: tuple[str, str]) -> None:
        t = gpu.telemetry
        f.add("nodeagent_gpu_memory_total_bytes", ids, gpu.info.memory_total_bytes)
        if t is None:
            return
        f.add("nodeagent_gpu_utilization_ratio", ids, t.utilization_gpu_ratio)
        f.add("nodeagent_gpu_memory_utilization_ratio", ids, t.utilization_memory_ratio)
        f.add("nodeagent_gpu_memory_used_bytes", ids, t.memory_used_bytes)
        f.add("nodeagent_gpu_memory_reserved_bytes", ids, t.memory_reserved_bytes)
        f.add("nodeagent_gpu_temperature_celsius", ids, t.temperature_celsius)
        f.add("nodeagent_gpu_slowdown_temperature_celsius", ids, t.temperature_slowdown_celsius)
        f.add("nodeagent_gpu_power_watts", ids, t.power_watts)
        f.add("nodeagent_gpu_power_limit_watts", ids, t.power_limit_watts)
        f.add("nodeagent_gpu_energy_joules_total", ids, t.energy_joules)
        f.add("nodeagent_gpu_sm_clock_hertz", ids, t.sm_clock_hz)
        f.add("nodeagent_gpu_memory_clock_hertz", ids, t.memory_clock_hz)
        if t.clock_event_reasons is not None:
            for reason in CLOCK_EVENT_REASONS:
                active = float(bool(t.clock_event_reasons & reason))
                f.add("nodeagent_gpu_clock_event_active", (*ids, reason.label), active)
        f.add("nodeagent_gpu_pcie_replays_total", ids, t.pcie_replay_count)
        for link in t.nvlinks:
            n = str(link.link)
            f.add("nodeagent_gpu_nvlink_up", (*ids, n), float(link.active))
            for kind, value in (
                ("replay", link.replay_errors),
                ("recovery", link.recovery_errors),
                ("crc_flit", link.crc_flit_errors),
            ):
                f.add("nodeagent_gpu_nvlink_errors_total", (*ids, n, kind), value)
        f.add("nodeagent_gpu_processes", ids, len(t.processes))
        if t.ecc is not None:
            for kind, scope, value in (
                ("corrected", "volatile", t.ecc.volatile_corrected),
                ("uncorrected", "volatile", t.ecc.volatile_uncorrected),
                ("corrected", "aggregate", t.ecc.aggregate_corrected),
                ("uncorrected", "aggregate", t.ecc.aggregate_uncorrected),
            ):
                f.add("nodeagent_gpu_ecc_errors_total", (*ids, kind, scope), value)
        if t.remapped_rows is not None:
            r = t.remapped_rows
            f.add("nodeagent_gpu_remapped_rows_total", (*ids, "correctable"), r.correctable)
            f.add("nodeagent_gpu_remapped_rows_total", (*ids, "uncorrectable"), r.uncorrectable)
            f.add("nodeagent_gpu_row_remap_pending", ids, float(r.pending))
            f.add("nodeagent_gpu_row_remap_failure", ids, float(r.failure))
        f.add("nodeagent_gpu_retired_pages_total", (*ids, "sbe"), t.retired_pages_sbe)
        f.add("nodeagent_gpu_retired_pages_total", (*ids, "dbe"), t.retired_pages_dbe)
        f.add("nodeagent_gpu_retired_pages_pending", ids, _bool(t.retired_pages_pending))

    def _health(
        self, f: _Families, gpu: GpuState, ids: tuple[str, str], dh: DeviceHealth | None
    ) -> None:
        # Without a health model the only fact known is lost-or-not; say that rather than
        # claim "healthy" for a GPU nobody checked.
        if dh is None:
            if not gpu.lost:
                return
            state = HealthState.LOST
        else:
            state = dh.state
        for candidate in HealthState:
            f.add("nodeagent_gpu_health_state", (*ids, candidate.value), float(candidate is state))

    def _mig(
        self,
        f: _Families,
        gpu: GpuState,
        ids: tuple[str, str],
        health: Mapping[str, DeviceHealth],
        fragmentation: tuple[float, int] | None,
    ) -> None:
        """Per-instance and per-GPU MIG series (``fragmentation``: ratio, stranded slices)."""
        for gi in gpu.mig_instances:
            mig = (*ids, gi.profile, str(gi.instance_id))
            info = (*mig, gi.uuid or "", str(gi.placement.start), str(gi.placement.size))
            f.add("nodeagent_mig_instance_info", info, 1)
            f.add("nodeagent_mig_instance_busy", mig, float(gi.busy))
            _profiling(f, "nodeagent_mig_prof_", MIG_PROFILING, mig, gi.profiling)
            dh = health.get(gi.uuid) if gi.uuid else None
            if dh is not None:
                for candidate in HealthState:
                    value = float(candidate is dh.state)
                    f.add("nodeagent_mig_health_state", (*mig, candidate.value), value)
        geometry = gpu.mig_geometry
        if geometry is None or fragmentation is None:
            return
        occupied = sum(gi.placement.size for gi in gpu.mig_instances)
        f.add("nodeagent_mig_slices", ids, geometry.memory_slices)
        f.add("nodeagent_mig_free_slices", ids, geometry.memory_slices - occupied)
        for profile, count in capacity.creatable(geometry, gpu.mig_instances).items():
            f.add("nodeagent_mig_creatable_instances", (*ids, profile), count)
        f.add("nodeagent_mig_fragmentation_ratio", ids, fragmentation[0])
        f.add("nodeagent_stranded_mig_slices", ids, fragmentation[1])

    @staticmethod
    def _is_free(gpu: GpuState, dh: DeviceHealth | None, allocated: set[str]) -> bool:
        if gpu.lost or gpu.telemetry is None or gpu.telemetry.processes:
            return False
        if dh is not None and not dh.state.schedulable:
            return False
        return gpu.info.uuid not in allocated

    def _xids_and_stability(
        self, f: _Families, snap: NodeSnapshot, source: HealthSource | None
    ) -> None:
        if source is None:
            return
        if not isinstance(source, NodeHealthSource):
            return
        view = source.node_health()
        index = {g.info.uuid: str(g.info.index) for g in snap.gpus}
        for (uuid, code), count in sorted(view.xids_total.items()):
            ids = (index.get(uuid, ""), uuid, str(code))
            f.add("nodeagent_gpu_xid_errors_total", ids, count)
            f.add(
                "nodeagent_gpu_xid_last_seen_timestamp_seconds",
                ids,
                view.xid_last_s.get((uuid, code)),
            )
        f.add("nodeagent_node_stability_score", (), view.score)
        f.add("nodeagent_health_history_errors_total", (), view.history_errors)
        level = str(view.level)
        for candidate in STABILITY_LEVELS:
            f.add("nodeagent_node_stability_level", (candidate,), float(candidate == level))

    @staticmethod
    def _mig_layout(f: _Families, snap: NodeSnapshot, status: MigLayoutStatus | None) -> None:
        """Whether the pool's MIG layout holds and, per GPU, what its last apply did."""
        if status is None:
            return
        f.add("nodeagent_mig_layout_applied", (status.layout, status.reason), float(status.applied))
        uuids = {g.info.index: g.info.uuid for g in snap.gpus}
        for g in status.gpus:
            ids = (str(g.gpu), uuids.get(g.gpu, ""))
            f.add("nodeagent_mig_apply_outcome", (*ids, g.outcome, g.reason), 1)
            f.add("nodeagent_mig_unrestored_instances", ids, g.unrestored)

    def _device_plugin(
        self,
        f: _Families,
        snap: NodeSnapshot,
        allocations: Allocations | None,
        advertised: Mapping[str, Mapping[str, bool]] | None,
        mig_by_uuid: Mapping[str, tuple[GpuState, GpuInstance]],
    ) -> None:
        """Advertised, unhealthy and allocated counts per resource, and pod attribution.

        Advertised comes from the agent's own device plugin when it runs (it knows what it
        serves, kubelet or not), else from the kubelet's allocatable resources (another plugin
        serves the GPUs). Allocated comes only from the kubelet: it is left out while the kubelet
        has never answered, so an absent series means "unknown" and 0 means "nothing allocated".
        """
        counts: dict[str, int] = {}
        unhealthy: dict[str, int] = {}
        if advertised is not None:
            for resource, devices in advertised.items():
                counts[resource] = len(devices)
                unhealthy[resource] = sum(1 for healthy in devices.values() if not healthy)
        elif allocations is not None and allocations.known:
            counts = dict(allocations.advertised)
        for resource, count in sorted(counts.items()):
            f.add("nodeagent_device_plugin_devices_advertised", (resource,), count)
        for resource, count in sorted(unhealthy.items()):
            f.add("nodeagent_device_plugin_devices_unhealthy", (resource,), count)
        if allocations is None:
            return
        f.add("nodeagent_pod_resources_up", (), float(allocations.ok))
        if not allocations.known:
            return
        age = max(0.0, snap.timestamp_s - allocations.timestamp_s)
        f.add("nodeagent_pod_resources_age_seconds", (), age)
        # Every resource someone knows of gets a series, so "none allocated" reads 0.
        for resource in sorted({*counts, *allocations.advertised, *allocations.allocated}):
            count = allocations.allocated.get(resource, 0)
            f.add("nodeagent_device_plugin_devices_allocated", (resource,), count)
        gpu_index = {g.info.uuid: str(g.info.index) for g in snap.gpus}
        for d in allocations.pod_devices:
            gpu, profile, instance = gpu_index.get(d.uuid, ""), "", ""
            if d.uuid in mig_by_uuid:
                owner, gi = mig_by_uuid[d.uuid]
                gpu, profile, instance = str(owner.info.index), gi.profile, str(gi.instance_id)
            labels = (d.resource, gpu, d.uuid, profile, instance, d.pod, d.namespace, d.container)
            f.add("nodeagent_device_plugin_pod_devices", labels, d.count)

    def _attribute(self, snap: NodeSnapshot, allocations: Allocations | None) -> None:
        """The processes with their pods and the shared devices; see nodeagent.workloads."""
        cgroups = self.sources.cgroups
        if cgroups is None:
            self.processes = ()
            self.shared = ()
            return
        holders = allocations.pod_devices if allocations is not None else ()
        index = self.sources.pod_index()
        cap = self.sources.max_workload_series
        # The inputs of the workload view: an unchanged node (a MIG node's processes hold
        # still) is not attributed again.
        gpus = tuple(
            (g.info.index, g.mig_instances, t.processes, t.utilization_gpu_ratio,
             t.memory_used_bytes, t.clock_event_reasons)  # what attribution and interference read
            for g in snap.gpus
            if (t := g.telemetry) is not None
        )  # fmt: skip
        key = (gpus, holders, index, cap)
        view = self._workload_view
        if view is None or view.key != key:
            view = _workload_view(key, snap, holders, cgroups, index, cap)
            self._workload_view = view
        self.processes = view.processes
        self.shared = view.shared

    def _workloads(self, f: _Families, snap: NodeSnapshot) -> None:
        """Usage per (device, container), and what no pod is found for."""
        view = self._workload_view
        if self.sources.cgroups is None or view is None:
            return
        # GPM figures by device (gpu, GPU instance or None): a container's row carries those
        # of the device it runs on.
        profiling: dict[tuple[int, int | None], Profiling | None] = {}
        for g in snap.gpus:
            profiling[(g.info.index, None)] = g.profiling
            for gi in g.mig_instances:
                profiling[(g.info.index, gi.instance_id)] = gi.profiling
        for ids, unattributed in view.unattributed:
            f.add("nodeagent_gpu_unattributed_memory_used_bytes", ids, unattributed)
        f.add("nodeagent_workload_series_dropped", (), view.dropped)
        for r in view.rows:
            w = r.workload
            labels = (*_device_labels(r.device), w.namespace, w.pod, w.container)
            f.add("nodeagent_workload_gpu_memory_used_bytes", labels, r.memory_used_bytes)
            f.add("nodeagent_workload_gpu_processes", labels, r.processes)
            if r.sm_share_ratio is not None:
                f.add("nodeagent_workload_gpu_sm_share_ratio", labels, min(1.0, r.sm_share_ratio))
            figures = profiling.get((r.device.gpu_index, r.device.mig_instance))
            _profiling(f, "nodeagent_workload_gpu_prof_", WORKLOAD_PROFILING, labels, figures)
        for d in view.shared:
            ids = _device_labels(d.device)
            f.add("nodeagent_shared_gpu_workloads", ids, len(d.workloads))
            f.add("nodeagent_shared_gpu_interference_ratio", ids, d.interference_ratio)
            f.add("nodeagent_shared_gpu_starvation_ratio", ids, d.starvation_ratio)
            f.add("nodeagent_shared_gpu_memory_pressure_ratio", ids, d.memory_pressure_ratio)
            f.add("nodeagent_shared_gpu_throttled", ids, _opt_flag(d.throttled))
            for w in d.workloads:
                if w.named:
                    labels = (*ids, w.namespace, w.pod, w.container)
                    f.add("nodeagent_workload_gpu_fair_share_ratio", labels, d.fair_share_ratio)
        for (device, w, xid), count in sorted(
            self.sources.app_xids().items(), key=lambda kv: (kv[0][0].uuid, kv[0][1].pod, kv[0][2])
        ):
            xid_labels = (*_device_labels(device), w.namespace, w.pod, w.container, str(xid))
            f.add("nodeagent_workload_gpu_xid_errors_total", xid_labels, count)
        probe = self.sources.probe()
        if probe is not None:
            failures = probe.failures()
            for device, result in sorted(probe.results().items(), key=lambda kv: kv[0].uuid):
                ids = _device_labels(device)
                f.add("nodeagent_shared_gpu_probe_duration_seconds", ids, result.duration_s)
                f.add("nodeagent_shared_gpu_probe_up", ids, float(result.ok))
                f.add("nodeagent_shared_gpu_probe_failures_total", ids, failures.get(device, 0))

    def _remediation(self, f: _Families, snap: NodeSnapshot) -> None:
        for (gpu, uuid, step, result), count in sorted(self.sources.remediation_steps().items()):
            f.add("nodeagent_gpu_remediation_steps_total", (str(gpu), uuid, step, result), count)
        index = {g.info.uuid: str(g.info.index) for g in snap.gpus}
        for uuid, passed in sorted(self.sources.validations().items()):
            f.add("nodeagent_gpu_validation_passed", (index.get(uuid, ""), uuid), float(passed))

    def _agent(self, f: _Families, snap: NodeSnapshot) -> None:
        f.add("nodeagent_sample_duration_seconds", (), snap.sample_duration_s)
        f.add("nodeagent_snapshot_timestamp_seconds", (), snap.timestamp_s)
        for function, count in sorted(self._nvml_errors.items()):
            f.add("nodeagent_nvml_errors_total", (function,), count)
        for component, count in sorted(dict(self.sources.restarts).items()):
            f.add("nodeagent_component_restarts_total", (component,), count)
        f.add("nodeagent_build_info", (self._version, self._python), 1)
        f.add("nodeagent_start_time_seconds", (), self.sources.started_at_s)
