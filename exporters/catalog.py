"""Every metric the exporter emits: name, type, labels and help, in one table.

``docs/metrics.md`` is generated from this table (``python -m nodeagent_exporters.catalog``) and
a test fails when an emitted metric is missing from it, so the table, the document and the
output stay in step. Names follow the project conventions: prefix ``nodeagent_``, base units in
the name, ratios 0..1, counters end in ``_total``; no hostname label (Prometheus adds
``instance``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Kind(enum.StrEnum):
    """Prometheus metric types used here."""

    GAUGE = "gauge"
    COUNTER = "counter"


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric family."""

    name: str  # the sample name as scraped (counters include ``_total``)
    kind: Kind
    labels: tuple[str, ...]
    unit: str  # human unit for the catalog ("bytes", "ratio", "1" for counts and flags)
    help: str
    group: str  # catalog section


G, C = Kind.GAUGE, Kind.COUNTER


@dataclass(frozen=True, slots=True)
class ProfilingFigure:
    """One GPM figure of :class:`nodeagent.gpu.types.Profiling` and the metrics it becomes."""

    field: str  # the Profiling attribute
    suffix: str  # nodeagent_{gpu,mig,workload_gpu}_prof_<suffix>
    unit: str
    help: str
    per_workload: bool = False  # also per pod: the figures that tell a busy container apart


# GPM figures (NVML_GPM_METRIC_*, what DCGM calls DCGM_FI_PROF_*), over the last interval.
PROFILING: tuple[ProfilingFigure, ...] = (
    ProfilingFigure("graphics_active_ratio", "graphics_active_ratio", "ratio",
                    "Share of the interval any graphics or compute engine was busy (GPM "
                    "GRAPHICS_UTIL).", per_workload=True),
    ProfilingFigure("sm_active_ratio", "sm_active_ratio", "ratio",
                    "Share of SMs busy over the interval (GPM SM_UTIL): what coarse "
                    "utilization cannot tell, a kernel on a few SMs from one on all.",
                    per_workload=True),
    ProfilingFigure("sm_occupancy_ratio", "sm_occupancy_ratio", "ratio",
                    "Resident warps vs the SMs' maximum (GPM SM_OCCUPANCY).", per_workload=True),
    ProfilingFigure("tensor_active_ratio", "tensor_active_ratio", "ratio",
                    "Share of the interval any tensor pipe was busy (GPM ANY_TENSOR_UTIL).",
                    per_workload=True),
    ProfilingFigure("dram_active_ratio", "dram_active_ratio", "ratio",
                    "DRAM bandwidth used vs the peak (GPM DRAM_BW_UTIL).", per_workload=True),
    ProfilingFigure("fp64_active_ratio", "fp64_active_ratio", "ratio",
                    "Share of the interval the FP64 pipe was busy, non-tensor (GPM FP64_UTIL)."),
    ProfilingFigure("fp32_active_ratio", "fp32_active_ratio", "ratio",
                    "Share of the interval the FP32 pipe was busy, non-tensor (GPM FP32_UTIL)."),
    ProfilingFigure("fp16_active_ratio", "fp16_active_ratio", "ratio",
                    "Share of the interval the FP16 pipe was busy, non-tensor (GPM FP16_UTIL)."),
    ProfilingFigure("pcie_tx_bytes_per_second", "pcie_tx_bytes_per_second", "bytes/s",
                    "PCIe traffic from the GPU (GPM PCIE_TX_PER_SEC)."),
    ProfilingFigure("pcie_rx_bytes_per_second", "pcie_rx_bytes_per_second", "bytes/s",
                    "PCIe traffic to the GPU (GPM PCIE_RX_PER_SEC)."),
    ProfilingFigure("nvlink_tx_bytes_per_second", "nvlink_tx_bytes_per_second", "bytes/s",
                    "NVLink traffic sent, all links (GPM NVLINK_TOTAL_TX_PER_SEC)."),
    ProfilingFigure("nvlink_rx_bytes_per_second", "nvlink_rx_bytes_per_second", "bytes/s",
                    "NVLink traffic received, all links (GPM NVLINK_TOTAL_RX_PER_SEC)."),
)  # fmt: skip
# PCIe and NVLink belong to the GPU: NVML does not split them per MIG instance.
MIG_PROFILING = tuple(f for f in PROFILING if not f.field.startswith(("pcie", "nvlink")))
WORKLOAD_PROFILING = tuple(f for f in PROFILING if f.per_workload)
_GPU = ("gpu", "uuid")
_MIG = ("gpu", "uuid", "mig_profile", "mig_instance")
_WORKLOAD = (*_MIG, "namespace", "pod", "container")

_SPECS: tuple[MetricSpec, ...] = (
    # --- inventory and driver ---------------------------------------------------------------
    MetricSpec(
        "nodeagent_gpu_info",
        G,
        (
            *_GPU,
            "model",
            "pci_bus_id",
            "driver_version",
            "cuda_version",
            "vbios_version",
            "mig_mode",
        ),
        "1",
        "Static facts of a GPU; always 1. mig_mode is enabled, disabled, or pending-enable / "
        "pending-disable while a mode change is pending (its activation failed, or the driver "
        "waits for a reset).",
        "inventory",
    ),
    MetricSpec(
        "nodeagent_driver_info",
        G,
        ("driver_version", "cuda_version"),
        "1",
        "The node's NVIDIA kernel driver and the CUDA version it supports; always 1.",
        "inventory",
    ),
    MetricSpec(
        "nodeagent_driver_drift",
        G,
        ("driver_version", "expected_driver_version"),
        "1",
        "1 when the node's driver differs from the pool policy's expected_driver_version, 0 when "
        "it matches or the policy expects none (then expected_driver_version is empty).",
        "inventory",
    ),
    MetricSpec(
        "nodeagent_gpus", G, (), "1", "GPUs the node reports, lost ones included.", "inventory"
    ),
    MetricSpec(
        "nodeagent_node_pool_info",
        G,
        ("pool",),
        "1",
        "The pool this node belongs to (node.pool); always 1. Join on instance to roll nodes "
        "up into pools.",
        "inventory",
    ),
    MetricSpec(
        "nodeagent_gpu_lost",
        G,
        _GPU,
        "1",
        "1 when the GPU stopped answering (fallen off the bus), else 0.",
        "inventory",
    ),
    # --- telemetry --------------------------------------------------------------------------
    MetricSpec(
        "nodeagent_gpu_utilization_ratio",
        G,
        _GPU,
        "ratio",
        "Share of the last sample period a kernel ran on the GPU (0..1).",
        "telemetry",
    ),
    MetricSpec(
        "nodeagent_gpu_memory_utilization_ratio",
        G,
        _GPU,
        "ratio",
        "Share of the last sample period device memory was read or written (0..1).",
        "telemetry",
    ),
    MetricSpec(
        "nodeagent_gpu_memory_used_bytes",
        G,
        _GPU,
        "bytes",
        "Device memory allocated by processes, as nvidia-smi shows it (with the reserved memory "
        "where the driver lacks memory info v2).",
        "telemetry",
    ),
    MetricSpec(
        "nodeagent_gpu_memory_reserved_bytes",
        G,
        _GPU,
        "bytes",
        "Device memory the driver and firmware set aside; absent where the driver lacks memory "
        "info v2.",
        "telemetry",
    ),
    MetricSpec(
        "nodeagent_gpu_memory_total_bytes",
        G,
        _GPU,
        "bytes",
        "Device memory installed.",
        "telemetry",
    ),
    MetricSpec(
        "nodeagent_gpu_temperature_celsius",
        G,
        _GPU,
        "celsius",
        "GPU core temperature.",
        "telemetry",
    ),
    MetricSpec(
        "nodeagent_gpu_slowdown_temperature_celsius",
        G,
        _GPU,
        "celsius",
        "Temperature at which the GPU starts slowing its clocks.",
        "telemetry",
    ),
    MetricSpec("nodeagent_gpu_power_watts", G, _GPU, "watts", "Power draw.", "telemetry"),
    MetricSpec(
        "nodeagent_gpu_power_limit_watts", G, _GPU, "watts", "Enforced power limit.", "telemetry"
    ),
    MetricSpec(
        "nodeagent_gpu_energy_joules_total",
        C,
        _GPU,
        "joules",
        "Energy consumed since the driver was loaded.",
        "telemetry",
    ),
    MetricSpec("nodeagent_gpu_sm_clock_hertz", G, _GPU, "hertz", "SM clock.", "telemetry"),
    MetricSpec("nodeagent_gpu_memory_clock_hertz", G, _GPU, "hertz", "Memory clock.", "telemetry"),
    MetricSpec(
        "nodeagent_gpu_clock_event_active",
        G,
        (*_GPU, "reason"),
        "1",
        "1 while this clock event (throttle) reason holds, one series per reason: gpu_idle, "
        "applications_clocks, sw_power_cap, hw_slowdown, sync_boost, sw_thermal_slowdown, "
        "hw_thermal_slowdown, hw_power_brake_slowdown, display_clocks.",
        "telemetry",
    ),
    MetricSpec(
        "nodeagent_gpu_pcie_replays_total",
        C,
        _GPU,
        "1",
        "PCIe replays (link-level retransmissions).",
        "telemetry",
    ),
    MetricSpec(
        "nodeagent_gpu_nvlink_up",
        G,
        (*_GPU, "link"),
        "1",
        "1 when the NVLink is active, 0 when it is down.",
        "telemetry",
    ),
    MetricSpec(
        "nodeagent_gpu_nvlink_errors_total",
        C,
        (*_GPU, "link", "type"),
        "1",
        "NVLink data-link errors by type: replay, recovery, crc_flit.",
        "telemetry",
    ),
    MetricSpec(
        "nodeagent_gpu_processes",
        G,
        _GPU,
        "1",
        "Compute processes on the GPU or its MIG instances.",
        "telemetry",
    ),
    # --- health -----------------------------------------------------------------------------
    MetricSpec(
        "nodeagent_gpu_ecc_errors_total",
        C,
        (*_GPU, "type", "scope"),
        "1",
        "ECC errors; type corrected|uncorrected, scope volatile (since driver load) | "
        "aggregate (lifetime).",
        "health",
    ),
    MetricSpec(
        "nodeagent_gpu_remapped_rows_total",
        C,
        (*_GPU, "type"),
        "1",
        "Memory rows remapped, type correctable|uncorrectable (lifetime of the GPU).",
        "health",
    ),
    MetricSpec(
        "nodeagent_gpu_row_remap_pending",
        G,
        _GPU,
        "1",
        "1 when a row remap waits for a GPU reset.",
        "health",
    ),
    MetricSpec(
        "nodeagent_gpu_row_remap_failure",
        G,
        _GPU,
        "1",
        "1 when a row remap has ever failed (RMA or field diagnostics).",
        "health",
    ),
    MetricSpec(
        "nodeagent_gpu_retired_pages_total",
        C,
        (*_GPU, "cause"),
        "1",
        "Pages retired (pre-Ampere), cause sbe|dbe.",
        "health",
    ),
    MetricSpec(
        "nodeagent_gpu_retired_pages_pending",
        G,
        _GPU,
        "1",
        "1 when a page retirement waits for a driver reload.",
        "health",
    ),
    MetricSpec(
        "nodeagent_gpu_xid_errors_total",
        C,
        (*_GPU, "xid"),
        "1",
        "XID errors seen since the agent started, by XID code.",
        "health",
    ),
    MetricSpec(
        "nodeagent_gpu_xid_last_seen_timestamp_seconds",
        G,
        (*_GPU, "xid"),
        "seconds",
        "Unix time the XID code was last seen on the GPU.",
        "health",
    ),
    MetricSpec(
        "nodeagent_gpu_health_state",
        G,
        (*_GPU, "state"),
        "1",
        "1 for the GPU's current health state (healthy, degraded, unhealthy, lost), 0 "
        "for the others.",
        "health",
    ),
    MetricSpec(
        "nodeagent_mig_health_state",
        G,
        (*_MIG, "state"),
        "1",
        "1 for the MIG device's current health state, 0 for the others.",
        "health",
    ),
    MetricSpec(
        "nodeagent_node_stability_score",
        G,
        (),
        "1",
        "The node stability score: the decayed sum of recent fault weights (0 = no recent "
        "faults; the level thresholds are health.degraded_enter / unstable_enter).",
        "health",
    ),
    MetricSpec(
        "nodeagent_node_stability_level",
        G,
        ("level",),
        "1",
        "1 for the node's current stability level, 0 for the others (stable, degraded, "
        "unstable; unknown while the agent has neither a usable history nor a first sample).",
        "health",
    ),
    MetricSpec(
        "nodeagent_health_history_errors_total",
        C,
        (),
        "1",
        "Health-history files found unusable at start and moved aside (history.json."
        "unusable-TIME) since the agent started; the node then starts from its last published "
        "status.",
        "health",
    ),
    # --- MIG --------------------------------------------------------------------------------
    MetricSpec(
        "nodeagent_mig_instance_info",
        G,
        (*_MIG, "mig_uuid", "placement_start", "placement_size"),
        "1",
        "One series per GPU instance: profile, placement (memory slices) and the UUID of "
        "its MIG device; always 1.",
        "mig",
    ),
    MetricSpec(
        "nodeagent_mig_instance_busy",
        G,
        _MIG,
        "1",
        "1 when processes run on the GPU instance.",
        "mig",
    ),
    MetricSpec(
        "nodeagent_mig_slices",
        G,
        _GPU,
        "1",
        "Memory slices of a MIG-enabled GPU (8, or 4 on A30).",
        "mig",
    ),
    MetricSpec(
        "nodeagent_mig_free_slices", G, _GPU, "1", "Memory slices no GPU instance occupies.", "mig"
    ),
    MetricSpec(
        "nodeagent_mig_creatable_instances",
        G,
        (*_GPU, "mig_profile"),
        "1",
        "How many more instances of this profile alone could still be created.",
        "mig",
    ),
    # --- fragmentation ----------------------------------------------------------------------
    MetricSpec(
        "nodeagent_mig_fragmentation_ratio",
        G,
        _GPU,
        "ratio",
        "Share of usable free slices the largest still-creatable profile cannot use "
        "(0 = unfragmented).",
        "fragmentation",
    ),
    MetricSpec(
        "nodeagent_mig_layout_applied",
        G,
        ("layout", "reason"),
        "1",
        "1 when the node holds its pool's MIG layout, 0 when the last round did not apply it; "
        "reason says why (the first GPU's problem, a bad layout file, another apply holding "
        "the MIG lock), empty when applied. Absent when the pool names no layout.",
        "mig",
    ),
    MetricSpec(
        "nodeagent_mig_apply_outcome",
        G,
        (*_GPU, "outcome", "reason"),
        "1",
        "What the agent's last MIG apply did on a GPU; always 1. outcome is applied, "
        "unchanged, reset-required, blocked-busy, failed or lost; reason says why the GPU does "
        "not hold the layout (empty when it does).",
        "mig",
    ),
    MetricSpec(
        "nodeagent_mig_unrestored_instances",
        G,
        _GPU,
        "1",
        "Instances the agent's last MIG apply destroyed on a GPU and could not recreate when a "
        "later step failed (0 after a clean apply or a full rollback).",
        "mig",
    ),
    MetricSpec(
        "nodeagent_free_gpus",
        G,
        (),
        "1",
        "Whole GPUs without MIG, processes, pod allocations or health problems.",
        "fragmentation",
    ),
    MetricSpec(
        "nodeagent_free_nvlink_set_gpus",
        G,
        (),
        "1",
        "Size of the largest set of free whole GPUs all connected by NVLink.",
        "fragmentation",
    ),
    MetricSpec(
        "nodeagent_stranded_mig_slices",
        G,
        _GPU,
        "1",
        "Free memory slices no profile in the pool's request_sizes (every profile when "
        "it lists none) can still use.",
        "fragmentation",
    ),
    MetricSpec(
        "nodeagent_stranded_gpus",
        G,
        (),
        "1",
        "Free whole GPUs no whole-GPU request size of the pool can use.",
        "fragmentation",
    ),
    # --- device plugin ----------------------------------------------------------------------
    MetricSpec(
        "nodeagent_device_plugin_devices_advertised",
        G,
        ("resource",),
        "1",
        "Devices advertised for the resource (replicas counted): what the agent's device "
        "plugin serves the kubelet, with or without a kubelet; with the plugin disabled, what "
        "the kubelet's pod-resources API reports allocatable.",
        "device plugin",
    ),
    MetricSpec(
        "nodeagent_device_plugin_devices_unhealthy",
        G,
        ("resource",),
        "1",
        "Advertised devices of the resource the agent's device plugin reports Unhealthy to the "
        "kubelet (replicas counted); absent when the plugin is disabled.",
        "device plugin",
    ),
    MetricSpec(
        "nodeagent_device_plugin_devices_allocated",
        G,
        ("resource",),
        "1",
        "Devices of the resource allocated to containers (replicas counted), from the kubelet's "
        "pod-resources API. 0 means none allocated; the series is absent while allocations are "
        "unknown (pod attribution off, or the API has not answered yet: see "
        "nodeagent_pod_resources_up).",
        "device plugin",
    ),
    MetricSpec(
        "nodeagent_device_plugin_pod_devices",
        G,
        ("resource", "gpu", "uuid", "mig_profile", "mig_instance", "pod", "namespace", "container"),
        "1",
        "Devices (replicas) of one GPU or MIG device held by a container; uuid is the "
        "device ID without its ::N replica suffix.",
        "device plugin",
    ),
    MetricSpec(
        "nodeagent_pod_resources_up",
        G,
        (),
        "1",
        "1 when the last kubelet pod-resources poll succeeded, 0 when it failed (allocated "
        "counts and attribution then stay at the last successful poll); absent when pod "
        "attribution is off.",
        "device plugin",
    ),
    MetricSpec(
        "nodeagent_pod_resources_age_seconds",
        G,
        (),
        "seconds",
        "Age of the pod attribution at render time.",
        "device plugin",
    ),
    MetricSpec(
        "nodeagent_gpu_remediation_steps_total",
        C,
        (*_GPU, "step", "result"),
        "1",
        "Remediation steps run before a GPU whose fault cleared serves again "
        "(pools.<pool>.remediation): step reset or validate, result passed, failed or skipped.",
        "health",
    ),
    MetricSpec(
        "nodeagent_gpu_validation_passed",
        G,
        _GPU,
        "1",
        "1 when the GPU's last validation (remediation.validate_command) passed, 0 when it "
        "failed (the GPU stays withdrawn, reason 'validation failed').",
        "health",
    ),
    # --- workloads on shared GPUs -----------------------------------------------------------
    MetricSpec(
        "nodeagent_gpu_unattributed_memory_used_bytes",
        G,
        _MIG,
        "bytes",
        "GPU memory used by processes no named pod is found for: host processes (the MPS "
        "server, a job outside Kubernetes), and processes whose cgroup cannot be read on a "
        "device several pods share.",
        "workloads",
    ),
    MetricSpec(
        "nodeagent_workload_gpu_memory_used_bytes",
        G,
        _WORKLOAD,
        "bytes",
        "GPU memory the processes of one container use on one GPU or MIG device (NVML's "
        "per-process used memory, summed).",
        "workloads",
    ),
    MetricSpec(
        "nodeagent_workload_gpu_sm_share_ratio",
        G,
        _WORKLOAD,
        "ratio",
        "Share of the GPU's time the container's kernels ran on it since the last sample (sum "
        "of its processes' NVML SM utilization samples). Absent where NVML keeps no "
        "per-process samples (MIG devices, GPUs with MIG on).",
        "workloads",
    ),
    MetricSpec(
        "nodeagent_workload_gpu_processes",
        G,
        _WORKLOAD,
        "1",
        "Compute processes of one container on one GPU or MIG device.",
        "workloads",
    ),
    MetricSpec(
        "nodeagent_workload_gpu_fair_share_ratio",
        G,
        _WORKLOAD,
        "ratio",
        "The container's fair share of a device that several workloads share (1/workloads); "
        "compare nodeagent_workload_gpu_sm_share_ratio. Absent on a device one workload uses.",
        "workloads",
    ),
    MetricSpec(
        "nodeagent_shared_gpu_workloads",
        G,
        _MIG,
        "1",
        "Workloads (containers) with processes on a GPU or MIG device that two or more share; "
        "the shared_gpu series exist only for such devices.",
        "workloads",
    ),
    MetricSpec(
        "nodeagent_shared_gpu_interference_ratio",
        G,
        _MIG,
        "ratio",
        "Noisy-neighbour signal of a shared device: the largest of its starvation ratio, its "
        "memory pressure above 0.8 (scaled so a full device is 1) and 1 while its clocks are "
        "throttled. 0 is quiet.",
        "workloads",
    ),
    MetricSpec(
        "nodeagent_shared_gpu_starvation_ratio",
        G,
        _MIG,
        "ratio",
        "How far the worst-served workload of a saturated shared device (utilization 0.9 or "
        "more) falls below its fair share: (fair - share) / fair; 0 while the device has room "
        "to spare. Absent where NVML keeps no per-process samples (MIG).",
        "workloads",
    ),
    MetricSpec(
        "nodeagent_shared_gpu_memory_pressure_ratio",
        G,
        _MIG,
        "ratio",
        "Used over total memory of a shared device (a MIG device: its profile's memory).",
        "workloads",
    ),
    MetricSpec(
        "nodeagent_shared_gpu_throttled",
        G,
        _MIG,
        "1",
        "1 while a shared device's GPU has its clocks held down by power or heat "
        "(sw_power_cap, hw_slowdown, sw/hw thermal slowdown, power brake), else 0.",
        "workloads",
    ),
    MetricSpec(
        "nodeagent_shared_gpu_probe_duration_seconds",
        G,
        _MIG,
        "seconds",
        "How long the last canary probe (metrics.probe, off by default) took on a shared "
        "device; it competes for the device as the workloads do, so its rise is what a "
        "neighbour costs.",
        "workloads",
    ),
    MetricSpec(
        "nodeagent_shared_gpu_probe_up",
        G,
        _MIG,
        "1",
        "1 when the last canary probe on a shared device exited 0 within its timeout, else 0.",
        "workloads",
    ),
    MetricSpec(
        "nodeagent_shared_gpu_probe_failures_total",
        C,
        _MIG,
        "1",
        "Canary probe runs on a device that failed (non-zero exit, timeout, could not start).",
        "workloads",
    ),
    MetricSpec(
        "nodeagent_workload_gpu_xid_errors_total",
        C,
        (*_WORKLOAD, "xid"),
        "1",
        "Application-class XIDs (13, 31, 43, 45, 68: the program's fault, not the GPU's) on "
        "a device while the container ran there; each also records a GPUApplicationXID "
        "Event on the pod.",
        "workloads",
    ),
    MetricSpec(
        "nodeagent_workload_series_dropped",
        G,
        (),
        "1",
        "Workload rows left out of this render because metrics.max_workload_series was "
        "reached (the largest memory users are kept).",
        "workloads",
    ),
    # --- profiling (GPM): one family per figure and scope, from PROFILING ---------------------
    *(
        MetricSpec(
            f"nodeagent_{scope}_prof_{f.suffix}", G, labels, f.unit, f"{f.help} {tail}", "profiling"
        )
        for scope, labels, tail, figures in (
            ("gpu", _GPU, "Whole GPU; absent on GPUs without GPM (before Hopper).", PROFILING),
            (
                "mig",
                _MIG,
                "One MIG GPU instance, relative to its own share of the GPU.",
                MIG_PROFILING,
            ),
            (
                "workload_gpu",
                _WORKLOAD,
                "The device a container runs on, with its pod (on a "
                "shared device every container on it sees the same device-wide figure).",
                WORKLOAD_PROFILING,
            ),
        )
        for f in figures
    ),
    # --- the agent itself -------------------------------------------------------------------
    MetricSpec(
        "nodeagent_sample_duration_seconds",
        G,
        (),
        "seconds",
        "How long the last NVML sampling pass took.",
        "agent",
    ),
    MetricSpec(
        "nodeagent_snapshot_timestamp_seconds",
        G,
        (),
        "seconds",
        "Unix time of the snapshot the metrics come from.",
        "agent",
    ),
    MetricSpec(
        "nodeagent_snapshot_age_seconds",
        G,
        (),
        "seconds",
        "Age of the served snapshot at scrape time (the only value computed per scrape).",
        "agent",
    ),
    MetricSpec(
        "nodeagent_render_duration_seconds",
        G,
        (),
        "seconds",
        "How long rendering the last snapshot into the exposition format took.",
        "agent",
    ),
    MetricSpec(
        "nodeagent_nvml_errors_total",
        C,
        ("function",),
        "1",
        "NVML calls that failed, by NVML function, since the agent started.",
        "agent",
    ),
    MetricSpec(
        "nodeagent_component_restarts_total",
        C,
        ("component",),
        "1",
        "Times a crashed agent component was restarted.",
        "agent",
    ),
    MetricSpec(
        "nodeagent_build_info",
        G,
        ("version", "python_version"),
        "1",
        "The agent's version; always 1.",
        "agent",
    ),
    MetricSpec(
        "nodeagent_start_time_seconds",
        G,
        (),
        "seconds",
        "Unix time the agent started. The agent's counters (XIDs, NVML errors, restarts) count "
        "from here: a restart sets them back to zero.",
        "agent",
    ),
)

CATALOG: dict[str, MetricSpec] = {spec.name: spec for spec in _SPECS}


def spec(name: str) -> MetricSpec:
    """The spec of a cataloged metric; KeyError names an uncataloged one (a programming error)."""
    return CATALOG[name]


def markdown() -> str:
    """The catalog as the Markdown document ``docs/metrics.md``."""
    lines = [
        "# Metrics",
        "",
        "<!-- Generated by `python -m nodeagent_exporters.catalog > docs/metrics.md`; "
        "do not edit. -->",
        "",
        "Every metric the exporter serves on `/metrics`. Conventions: prefix `nodeagent_`, base",
        "units in the name, ratios 0..1, counters end in `_total`. GPU metrics carry `gpu` (index)",
        "and `uuid` (the GPU's UUID); MIG metrics add `mig_profile` and `mig_instance` (the GPU",
        "instance ID). There is no hostname label: Prometheus adds `instance`.",
        "",
        "A test fails when the exporter emits a metric that is missing here.",
        "",
        "Label cardinality of the workloads group: one series per (device, container) with a",
        "compute process on it. A device has as many containers as its sharing replicas at",
        "most (time-slicing or MPS replicas, 1 for an exclusive GPU or a MIG device), so a node",
        "has at most the sum of its advertised devices; `metrics.max_workload_series` (default",
        "1000) caps it regardless, and `nodeagent_workload_series_dropped` says when it bites.",
        "No PID, process name or pod UID becomes a label.",
    ]
    groups: dict[str, list[MetricSpec]] = {}
    for s in _SPECS:
        groups.setdefault(s.group, []).append(s)
    for group, specs in groups.items():
        lines += [
            "",
            f"## {group[0].upper()}{group[1:]}",
            "",
            "| metric | type | unit | labels | help |",
            "|---|---|---|---|---|",
        ]
        for s in specs:
            labels = ", ".join(f"`{label}`" for label in s.labels) or "-"
            lines.append(f"| `{s.name}` | {s.kind} | {s.unit} | {labels} | {s.help} |")
    # The dcgm-exporter view's table lives with the view (nodeagent_exporters.dcgm_compat).
    from nodeagent_exporters import dcgm_compat

    lines += dcgm_compat.markdown()
    lines += [
        "",
        "## Tiering service",
        "",
        "The cluster's tiering service (`nodeagent tiering run`) serves its own",
        "`nodeagent_tiering_*` metrics on its own port; they are cataloged, with a test that",
        "keeps that list in step with the service, in [tiering.md](tiering.md#metrics).",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
