"""A dcgm-exporter compatibility view: its default families, names, types, units and labels.

Teams' dashboards and alerts query dcgm-exporter's names (``DCGM_FI_DEV_GPU_UTIL{gpu="0",
UUID=...}``). With ``metrics.dcgm_compat`` on, every render appends these families, made from
the very snapshot the ``nodeagent_*`` families come from: no second NVML pass, and the scrape
still writes prepared bytes.

The field list follows dcgm-exporter's ``etc/default-counters.csv`` as shipped from 3.3 through
4.8 (4.9 renamed the fields to DCGM 4.7's names and changed units: clocks in hertz, memory in
bytes, utilisation as a ratio). Units are dcgm-exporter's, not ours: MHz, MiB, percent,
millijoules. A field nodeagent has no reading for is left out, never exported as 0; :data:`FIELDS`
says for each one what it comes from or why it is not served, and ``docs/metrics.md`` is
generated from it.

Labels as dcgm-exporter writes them: ``gpu`` (index), ``UUID``, ``pci_bus_id``, ``device``
(``nvidia<minor>``), ``modelName``, ``Hostname`` (the node name), ``DCGM_FI_DRIVER_VERSION``
(the default file's one ``label`` row), ``GPU_I_PROFILE`` and ``GPU_I_ID`` on a MIG instance's
series, and ``pod``, ``namespace``, ``container`` on the series of a device a container holds.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from nodeagent.gpu.types import GpuInstance, GpuState, NodeSnapshot, Profiling, Telemetry
from nodeagent.runtime.health_source import HealthSource, NodeHealthSource
from nodeagent_exporters.podresources import Allocations

MIB = 1 << 20
MHZ = 1e6

# dcgm-exporter's release line followed here (docs/metrics.md names it).
FOLLOWED_VERSION = "3.3 to 4.8"


@dataclass(frozen=True, slots=True)
class _Reading:
    """What one device's series are computed from: a GPU's telemetry, last XID and
    profiling, or (a MIG instance) its profiling alone."""

    telemetry: Telemetry | None  # None: a lost GPU, one whose sampling failed, a MIG instance
    last_xid: int | None  # None: not known (no health model, or a lost GPU without XIDs)
    profiling: Profiling | None  # None: no GPM figures (before Hopper, or profiling off)


Value = Callable[[_Reading], float | None]


@dataclass(frozen=True, slots=True)
class Field:
    """One row of dcgm-exporter's default counters file, and how nodeagent serves it."""

    name: str
    kind: str  # Prometheus type as dcgm-exporter declares it: gauge or counter
    unit: str  # dcgm-exporter's unit (its help text says it)
    help: str
    ours: str  # the nodeagent metric the value comes from ("" when not served)
    source: str  # the NVML reading behind it, or why it is not served
    value: Value | None = None  # None: not served

    @property
    def served(self) -> bool:
        """Whether the view exports this field."""
        return self.value is not None


def _sampled(get: Callable[[Telemetry], float | int | None], factor: float = 1.0) -> Value:
    """A field read from the GPU's telemetry (absent without it), times ``factor``."""

    def value(r: _Reading) -> float | None:
        raw = None if r.telemetry is None else get(r.telemetry)
        return None if raw is None else raw * factor

    return value


def _profiled(get: Callable[[Profiling], float | None]) -> Value:
    """A field read from the device's GPM figures (absent without them)."""
    return lambda r: None if r.profiling is None else get(r.profiling)


def _xid(r: _Reading) -> float | None:
    # dcgm-exporter reads 0 until a GPU has had an XID; here 0 is a fact only while the
    # health model watches the event stream, so without it the series is left out.
    return None if r.last_xid is None else float(r.last_xid)


FIELDS: tuple[Field, ...] = (
    Field(
        "DCGM_FI_DEV_SM_CLOCK",
        "gauge",
        "MHz",
        "SM clock frequency in MHz.",
        "`nodeagent_gpu_sm_clock_hertz` / 1e6",
        "nvmlDeviceGetClockInfo(NVML_CLOCK_SM)",
        _sampled(lambda t: t.sm_clock_hz, 1 / MHZ),
    ),
    Field(
        "DCGM_FI_DEV_MEM_CLOCK",
        "gauge",
        "MHz",
        "Memory clock frequency in MHz.",
        "`nodeagent_gpu_memory_clock_hertz` / 1e6",
        "nvmlDeviceGetClockInfo(NVML_CLOCK_MEM)",
        _sampled(lambda t: t.memory_clock_hz, 1 / MHZ),
    ),
    Field(
        "DCGM_FI_DEV_MEMORY_TEMP",
        "gauge",
        "C",
        "Memory (HBM) temperature in degrees C.",
        "",
        "not sampled: nodeagent reads the GPU core temperature only",
    ),
    Field(
        "DCGM_FI_DEV_GPU_TEMP",
        "gauge",
        "C",
        "GPU core temperature in degrees C.",
        "`nodeagent_gpu_temperature_celsius`",
        "nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)",
        _sampled(lambda t: t.temperature_celsius),
    ),
    Field(
        "DCGM_FI_DEV_POWER_USAGE",
        "gauge",
        "W",
        "Power draw in watts.",
        "`nodeagent_gpu_power_watts`",
        "nvmlDeviceGetPowerUsage",
        _sampled(lambda t: t.power_watts),
    ),
    Field(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "mJ",
        "Energy consumed since the driver was loaded, in millijoules.",
        "`nodeagent_gpu_energy_joules_total` * 1000",
        "nvmlDeviceGetTotalEnergyConsumption",
        _sampled(lambda t: t.energy_joules, 1000.0),
    ),
    Field(
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "counter",
        "1",
        "PCIe replays (link-level retries).",
        "`nodeagent_gpu_pcie_replays_total`",
        "nvmlDeviceGetPcieReplayCounter",
        _sampled(lambda t: t.pcie_replay_count),
    ),
    Field(
        "DCGM_FI_DEV_GPU_UTIL",
        "gauge",
        "%",
        "GPU utilization in percent (absent on a GPU with MIG on: NVML has none).",
        "`nodeagent_gpu_utilization_ratio` * 100",
        "nvmlDeviceGetUtilizationRates .gpu",
        _sampled(lambda t: t.utilization_gpu_ratio, 100.0),
    ),
    Field(
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "gauge",
        "%",
        "Memory utilization (share of time memory was read or written) in percent.",
        "`nodeagent_gpu_memory_utilization_ratio` * 100",
        "nvmlDeviceGetUtilizationRates .memory",
        _sampled(lambda t: t.utilization_memory_ratio, 100.0),
    ),
    Field(
        "DCGM_FI_DEV_ENC_UTIL",
        "gauge",
        "%",
        "Encoder utilization in percent.",
        "",
        "not sampled: video engines are outside nodeagent's scope",
    ),
    Field(
        "DCGM_FI_DEV_DEC_UTIL",
        "gauge",
        "%",
        "Decoder utilization in percent.",
        "",
        "not sampled: video engines are outside nodeagent's scope",
    ),
    Field(
        "DCGM_FI_DEV_XID_ERRORS",
        "gauge",
        "1",
        "Code of the last XID error seen on the GPU (0: none since the agent started).",
        "the `xid` label of the newest `nodeagent_gpu_xid_last_seen_timestamp_seconds`",
        "NVML event set, nvmlEventTypeXidCriticalError (the health model)",
        _xid,
    ),
    Field(
        "DCGM_FI_DEV_FB_FREE",
        "gauge",
        "MiB",
        "Framebuffer memory free in MiB.",
        "(`nodeagent_gpu_memory_total_bytes` - used - reserved) / 2^20",
        "nvmlDeviceGetMemoryInfo_v2 .free",
        _sampled(lambda t: t.memory_free_bytes, 1 / MIB),
    ),
    Field(
        "DCGM_FI_DEV_FB_USED",
        "gauge",
        "MiB",
        "Framebuffer memory used in MiB.",
        "`nodeagent_gpu_memory_used_bytes` / 2^20",
        "nvmlDeviceGetMemoryInfo_v2 .used",
        _sampled(lambda t: t.memory_used_bytes, 1 / MIB),
    ),
    Field(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "counter",
        "1",
        "NVLink bandwidth counters summed over all links.",
        "",
        "not sampled: nodeagent reads NVLink state and error counters, not throughput",
    ),
    Field(
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
        "gauge",
        "1",
        "vGPU license status.",
        "",
        "not applicable: nodeagent manages bare-metal GPUs, not vGPU guests",
    ),
    Field(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "1",
        "Rows remapped for uncorrectable errors.",
        '`nodeagent_gpu_remapped_rows_total{type="uncorrectable"}`',
        "nvmlDeviceGetRemappedRows",
        _sampled(lambda t: None if t.remapped_rows is None else t.remapped_rows.uncorrectable),
    ),
    Field(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "counter",
        "1",
        "Rows remapped for correctable errors.",
        '`nodeagent_gpu_remapped_rows_total{type="correctable"}`',
        "nvmlDeviceGetRemappedRows",
        _sampled(lambda t: None if t.remapped_rows is None else t.remapped_rows.correctable),
    ),
    Field(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "gauge",
        "1",
        "1 when a row remap has failed.",
        "`nodeagent_gpu_row_remap_failure`",
        "nvmlDeviceGetRemappedRows (isFailure)",
        _sampled(lambda t: None if t.remapped_rows is None else t.remapped_rows.failure),
    ),
    Field(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "gauge",
        "ratio",
        "Share of time the graphics or compute engine was active (0..1).",
        "`nodeagent_gpu_prof_graphics_active_ratio`, `nodeagent_mig_prof_graphics_active_ratio`",
        "nvmlGpmMetricsGet NVML_GPM_METRIC_GRAPHICS_UTIL",
        _profiled(lambda p: p.graphics_active_ratio),
    ),
    Field(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "ratio",
        "Share of cycles the tensor pipe was active (0..1).",
        "`nodeagent_gpu_prof_tensor_active_ratio`, `nodeagent_mig_prof_tensor_active_ratio`",
        "nvmlGpmMetricsGet NVML_GPM_METRIC_ANY_TENSOR_UTIL",
        _profiled(lambda p: p.tensor_active_ratio),
    ),
    Field(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "ratio",
        "Share of cycles device memory was sending or receiving data (0..1).",
        "`nodeagent_gpu_prof_dram_active_ratio`, `nodeagent_mig_prof_dram_active_ratio`",
        "nvmlGpmMetricsGet NVML_GPM_METRIC_DRAM_BW_UTIL",
        _profiled(lambda p: p.dram_active_ratio),
    ),
    Field(
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "gauge",
        "B/s",
        "PCIe transmit rate, headers included, in bytes per second.",
        "`nodeagent_gpu_prof_pcie_tx_bytes_per_second`",
        "nvmlGpmMetricsGet NVML_GPM_METRIC_PCIE_TX_PER_SEC",
        _profiled(lambda p: p.pcie_tx_bytes_per_second),
    ),
    Field(
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "gauge",
        "B/s",
        "PCIe receive rate, headers included, in bytes per second.",
        "`nodeagent_gpu_prof_pcie_rx_bytes_per_second`",
        "nvmlGpmMetricsGet NVML_GPM_METRIC_PCIE_RX_PER_SEC",
        _profiled(lambda p: p.pcie_rx_bytes_per_second),
    ),
)

SERVED: tuple[Field, ...] = tuple(f for f in FIELDS if f.served)

# The queries docs/metrics.md lists, which the integration test runs against a real Prometheus
# scraping a simulated node. First those of NVIDIA's Grafana dashboard for dcgm-exporter
# (written from its documented panels, the template variables matching everything), then
# common alert expressions. The DCGM_FI_PROF_* ones need GPM (Hopper and later; the simulated
# H100s have it) and, for the MIG one, an instance's own GPM figures.
_ALL = 'instance=~".+", gpu=~".+"'
QUERIES: tuple[str, ...] = (
    f"DCGM_FI_DEV_GPU_TEMP{{{_ALL}}}",
    f"avg(DCGM_FI_DEV_GPU_TEMP{{{_ALL}}})",
    f"DCGM_FI_DEV_POWER_USAGE{{{_ALL}}}",
    f"sum(DCGM_FI_DEV_POWER_USAGE{{{_ALL}}})",
    f"DCGM_FI_DEV_SM_CLOCK{{{_ALL}}} * 1000000",
    f"DCGM_FI_DEV_MEM_CLOCK{{{_ALL}}} * 1000000",
    f"DCGM_FI_DEV_GPU_UTIL{{{_ALL}}}",
    f"DCGM_FI_DEV_MEM_COPY_UTIL{{{_ALL}}}",
    f"DCGM_FI_DEV_FB_USED{{{_ALL}}}",
    f"DCGM_FI_DEV_FB_FREE{{{_ALL}}}",
    "DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE) > 0",
    "rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[1m]) / 1000",
    "increase(DCGM_FI_DEV_PCIE_REPLAY_COUNTER[5m]) >= 0",
    "DCGM_FI_DEV_XID_ERRORS > 0",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS + DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE == 0",
    'count by (modelName, DCGM_FI_DRIVER_VERSION) (DCGM_FI_DEV_GPU_TEMP{device=~"nvidia.+"})',
    'DCGM_FI_DEV_FB_USED{pod!=""}',
    f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{_ALL}}}",
    f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{_ALL}}}",
    f"DCGM_FI_PROF_DRAM_ACTIVE{{{_ALL}}}",
    "DCGM_FI_PROF_PCIE_TX_BYTES + DCGM_FI_PROF_PCIE_RX_BYTES",
    'avg by (GPU_I_PROFILE) (DCGM_FI_PROF_GR_ENGINE_ACTIVE{GPU_I_ID!=""})',
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    return ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)


def _number(value: float) -> str:
    # dcgm-exporter prints integers as integers; keep whole values that way (MiB, codes).
    if math.isfinite(value):
        return str(int(value)) if value.is_integer() else repr(value)
    return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")


Labels = tuple[tuple[str, str], ...]


def gpu_labels(gpu: GpuState, hostname: str, instance: GpuInstance | None = None) -> Labels:
    """The labels dcgm-exporter puts on a GPU's series (or a MIG instance's), in its order."""
    i = gpu.info
    minor = i.minor_number if i.minor_number is not None else i.index
    mig: Labels = ()
    if instance is not None:
        mig = (("GPU_I_PROFILE", instance.profile), ("GPU_I_ID", str(instance.instance_id)))
    return (
        ("gpu", str(i.index)),
        ("UUID", i.uuid),
        ("pci_bus_id", i.pci_bus_id),
        ("device", f"nvidia{minor}"),
        ("modelName", i.name),
        *mig,
        ("Hostname", hostname),
        ("DCGM_FI_DRIVER_VERSION", i.driver_version),
    )


def last_xids(health: HealthSource | None) -> dict[str, int] | None:
    """GPU UUID -> code of its most recent XID; None when no health model watches events."""
    if not isinstance(health, NodeHealthSource):
        return None
    view = health.node_health()
    latest: dict[str, tuple[float, int]] = {}
    for (uuid, code), seen in view.xid_last_s.items():
        if uuid not in latest or seen >= latest[uuid][0]:
            latest[uuid] = (seen, code)
    return {uuid: code for uuid, (_seen, code) in latest.items()}


Holder = tuple[str, str, str]  # pod, namespace, container


def _holders(allocations: Allocations | None) -> dict[str, tuple[Holder, ...]]:
    """Device UUID -> (pod, namespace, container) of each container holding it (replicas
    of a shared GPU count once per container)."""
    out: dict[str, list[Holder]] = {}
    if allocations is None:
        return {}
    for d in allocations.pod_devices:
        held = out.setdefault(d.uuid, [])
        who = (d.pod, d.namespace, d.container)
        if who not in held:
            held.append(who)
    return {uuid: tuple(held) for uuid, held in out.items()}


@functools.lru_cache(maxsize=4096)
def _label_sets(base: Labels, held: tuple[Holder, ...]) -> tuple[str, ...]:
    """The label text of a device's series: one per holding container, else one.

    Cached: a node's devices and their holders change rarely, and formatting the labels is
    most of this view's render time (hundreds of pods on a MIG node).
    """
    if not held:
        return (_labels(base),)
    return tuple(
        _labels((*base, ("pod", p), ("namespace", n), ("container", c))) for p, n, c in held
    )


def render(
    snapshot: NodeSnapshot,
    hostname: str,
    health: HealthSource | None = None,
    allocations: Allocations | None = None,
) -> bytes:
    """The compatibility families of ``snapshot`` as exposition text (appended to the body).

    A device a container holds (a whole GPU, or a MIG instance through its MIG device UUID)
    gets one series per holding container with ``pod``, ``namespace`` and ``container``
    (dcgm-exporter's Kubernetes mode), else one without them. A MIG instance has series only
    for its GPM figures, labelled ``GPU_I_PROFILE`` and ``GPU_I_ID`` besides its GPU's labels.
    A lost GPU (or one whose sampling failed) keeps only its last XID, when it had one: that
    is the series an alert on XID 79 (fallen off the bus) needs; its other values are unknown.
    """
    xids = last_xids(health)
    holders = _holders(allocations)
    # The label sets of each device, computed once per render rather than once per field.
    rows: list[tuple[_Reading, tuple[str, ...]]] = []

    def add(reading: _Reading, base: Labels, uuid: str | None) -> None:
        held = holders.get(uuid, ()) if uuid else ()
        rows.append((reading, _label_sets(base, held)))

    for gpu in snapshot.gpus:
        t = None if gpu.lost else gpu.telemetry
        last = None if xids is None else xids.get(gpu.info.uuid, 0 if t is not None else None)
        profiling = None if gpu.lost else gpu.profiling
        if t is not None or last is not None or profiling is not None:
            add(_Reading(t, last, profiling), gpu_labels(gpu, hostname), gpu.info.uuid)
        if gpu.lost:
            continue
        for gi in gpu.mig_instances:
            if gi.profiling is not None:
                add(_Reading(None, None, gi.profiling), gpu_labels(gpu, hostname, gi), gi.uuid)
    out: list[str] = []
    for f in SERVED:
        assert f.value is not None
        samples: list[str] = []
        for reading, label_sets in rows:
            v = f.value(reading)
            if v is None:
                continue
            text = _number(float(v))
            samples.extend(f"{f.name}{{{labels}}} {text}\n" for labels in label_sets)
        if samples:
            out.append(f"# HELP {f.name} {f.help}\n# TYPE {f.name} {f.kind}\n")
            out.extend(samples)
    return "".join(out).encode()


def markdown() -> list[str]:
    """The section of ``docs/metrics.md`` on the view: served fields, left-out fields, queries."""
    lines = [
        "",
        "## dcgm-exporter compatibility",
        "",
        "With `metrics.dcgm_compat: true` (`NODEAGENT_METRICS_DCGM_COMPAT=true`; off by default)",
        "the exporter also serves the families of dcgm-exporter's default counters file",
        f"(`etc/default-counters.csv` of dcgm-exporter {FOLLOWED_VERSION}; 4.9 renamed the fields",
        "and changed their units) under its names, types and units, made from the same snapshot",
        "as the metrics above: no second NVML pass. Labels as dcgm-exporter writes them: `gpu`",
        "(index), `UUID`, `pci_bus_id`, `device` (`nvidia<minor>`), `modelName`, `Hostname` (the",
        "node name), `DCGM_FI_DRIVER_VERSION`, and `pod`, `namespace`, `container` on the series",
        "of a device a container holds (one series per container). `GPU_I_PROFILE` and `GPU_I_ID`",
        "label per-MIG-instance series, which only the profiling fields have (from the",
        "instance's own GPM figures). A field nodeagent has no reading for is left out, never",
        "served as 0: the profiling fields need GPM (Hopper and later), `DCGM_FI_DEV_GPU_UTIL` is",
        "absent on a GPU with MIG on (NVML has none), `DCGM_FI_DEV_XID_ERRORS` needs the health",
        "model (it reads 0 on a watched GPU without XIDs; a lost GPU keeps its last code).",
        "",
        "| dcgm-exporter field | type | unit | nodeagent metric | NVML source |",
        "|---|---|---|---|---|",
    ]
    for f in SERVED:
        lines.append(f"| `{f.name}` | {f.kind} | {f.unit} | {f.ours} | {f.source} |")
    lines += [
        "",
        "Fields of the default file not served, and why:",
        "",
        "| dcgm-exporter field | type | unit | why |",
        "|---|---|---|---|",
    ]
    for f in FIELDS:
        if not f.served:
            lines.append(f"| `{f.name}` | {f.kind} | {f.unit} | {f.source} |")
    lines += [
        "",
        "Queries of NVIDIA's dcgm-exporter Grafana dashboard (its template variables matching",
        "everything) and of common alerts; each returns series from a simulated dgx-h100 with",
        "MIG, pods and an XID, in an integration test that runs them against a real Prometheus:",
        "",
        "| query |",
        "|---|",
    ]
    lines += [f"| `{q}` |" for q in QUERIES]
    return lines
