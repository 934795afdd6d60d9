"""GPU Performance Monitoring (GPM) of a simulated GPU: the profiling figures NVML computes.

Real GPM (Hopper and later, driver R520+) counts per-SM and per-pipe activity in the hardware;
``nvmlGpmMetricsGet`` turns two samples of those counters into metrics over the time between
them. The simulator has no counters: a sample records the activity the load model
(:mod:`nodeagent.sim.telemetry`) gives at the sample's time, and a metric is the mean of the two
samples' figures (the trapezoid rule; the load's wave has a period of minutes, so over a
sampling interval it is as good as the exact mean).

The figures are derived from the same per-process busy shares as the coarse utilisation
(``nvmlDeviceGetUtilizationRates``), so they agree with it: SM activity is the busy time times
the share of SMs a kernel keeps busy (never above the coarse figure), DRAM activity follows the
memory-controller share, and the pipes split the SM activity in a fixed training-like mix.
These mixes are simulator choices, not measurements.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pynvml

from nodeagent.sim import models, telemetry

# GPM exists on Hopper and later (nvml.h: "Hopper or newer fully supported devices").
GPM_GENERATIONS = frozenset({"hopper", "blackwell"})
GPM_MIN_DRIVER_BRANCH = 520  # the first driver branch with the nvmlGpm* entry points

# Share of the SMs a busy kernel keeps busy (SM_UTIL / coarse GPU utilisation), and the mixes.
SM_FILL = 0.85
OCCUPANCY_PER_SM = 0.55  # resident warps vs the maximum, while SMs are busy
TENSOR_PER_SM = 0.6
FP32_PER_SM = 0.25
FP16_PER_SM = 0.1
FP64_PER_SM = 0.02
INTEGER_PER_SM = 0.15
# DRAM bandwidth used vs peak, per unit of memory-controller busy time.
DRAM_PER_MEMORY_BUSY = 0.9
# Host traffic of a fully busy GPU (bytes/s): inputs in, results out; an idle GPU moves none.
PCIE_RX_FULL = 6.0e9
PCIE_TX_FULL = 2.0e9
MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Activity:
    """What one GPU or GPU instance is doing at one moment (ratios 0..1, rates in bytes/s)."""

    graphics: float
    sm: float
    occupancy: float
    tensor: float
    dram: float
    fp64: float
    fp32: float
    fp16: float
    integer: float
    pcie_tx: float | None  # None: not counted for a MIG instance
    pcie_rx: float | None
    nvlink_tx: float | None
    nvlink_rx: float | None


@dataclass(frozen=True, slots=True)
class Sample:
    """A taken GPM sample: which device or instance, when, and its activity then."""

    gpu: int
    gpu_instance: int | None
    time_s: float
    activity: Activity


def supported(gpu: dict[str, Any]) -> bool:
    """Whether the GPU's model has GPM."""
    return models.MODELS[gpu["model"]].generation in GPM_GENERATIONS


def _activity(busy: float, *, whole_gpu: bool, nvlinks: int) -> Activity:
    """The figures of a device whose kernels run ``busy`` of the time (0..1)."""
    busy = min(1.0, max(0.0, busy))
    sm = busy * SM_FILL
    memory_busy = busy * telemetry.MEMORY_BUSY_PER_SM
    return Activity(
        graphics=busy,
        sm=sm,
        occupancy=sm * OCCUPANCY_PER_SM,
        tensor=sm * TENSOR_PER_SM,
        dram=memory_busy * DRAM_PER_MEMORY_BUSY,
        fp64=sm * FP64_PER_SM,
        fp32=sm * FP32_PER_SM,
        fp16=sm * FP16_PER_SM,
        integer=sm * INTEGER_PER_SM,
        # PCIe and NVLink are the GPU's, not an instance's: NVML does not split them per MIG
        # instance, so the simulator answers NOT_SUPPORTED for them there.
        pcie_tx=busy * PCIE_TX_FULL if whole_gpu else None,
        pcie_rx=busy * PCIE_RX_FULL if whole_gpu else None,
        # No simulated traffic crosses NVLink (the NVLink throughput fields read 0 as well).
        nvlink_tx=0.0 if whole_gpu and nvlinks else None,
        nvlink_rx=0.0 if whole_gpu and nvlinks else None,
    )


def gpu_activity(gpu: dict[str, Any], procs: list[dict[str, Any]], now: float) -> Activity:
    """The whole GPU: every process's busy share, as in the coarse utilisation."""
    busy = sum(telemetry.process_busy(gpu, procs, now).values())
    return _activity(busy, whole_gpu=True, nvlinks=len(gpu["nvlinks"]))


def instance_activity(
    gpu: dict[str, Any], gi: dict[str, Any], procs: list[dict[str, Any]], now: float
) -> Activity:
    """One GPU instance, relative to its own SMs: its processes' share of the GPU over its slice.

    A process alone on a 3g instance of a 7-slice GPU asks for 3/7 of the GPU's time at full
    load; relative to the instance that is the whole of it.
    """
    model = models.MODELS[gpu["model"]]
    profile = model.profile_by_id(gi["profile_id"])
    fraction = profile.compute_slices / model.max_mig_devices if profile is not None else 1.0
    shares = telemetry.process_busy(gpu, procs, now)
    busy = sum(share for p in procs if p["gi"] == gi["id"] for share in [shares[int(p["pid"])]])
    return _activity(busy / fraction if fraction > 0 else 0.0, whole_gpu=False, nvlinks=0)


def _mean(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return None
    return (a + b) / 2.0


def _percent(value: float | None) -> float | None:
    return None if value is None else 100.0 * value


def _mib_per_s(value: float | None) -> float | None:
    return None if value is None else value / MIB


# The metrics the simulator computes, by NVML metric id: the Activity field behind each.
_PERCENT = {
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: "graphics",
    pynvml.NVML_GPM_METRIC_SM_UTIL: "sm",
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: "occupancy",
    pynvml.NVML_GPM_METRIC_INTEGER_UTIL: "integer",
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: "tensor",
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: "dram",
    pynvml.NVML_GPM_METRIC_FP64_UTIL: "fp64",
    pynvml.NVML_GPM_METRIC_FP32_UTIL: "fp32",
    pynvml.NVML_GPM_METRIC_FP16_UTIL: "fp16",
}
_RATES = {
    pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: "pcie_tx",
    pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: "pcie_rx",
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: "nvlink_tx",
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: "nvlink_rx",
}
MODELLED_METRICS = frozenset(_PERCENT) | frozenset(_RATES)


def metric(metric_id: int, first: Activity, second: Activity) -> float | None:
    """The value NVML reports for ``metric_id`` between two samples (percent or MiB/s).

    ``None`` where the metric is not computed for this device (its ``nvmlReturn`` is then
    NOT_SUPPORTED); KeyError for a metric id the simulator does not model.
    """
    if metric_id in _PERCENT:
        name = _PERCENT[metric_id]
        return _percent(_mean(getattr(first, name), getattr(second, name)))
    name = _RATES[metric_id]
    return _mib_per_s(_mean(getattr(first, name), getattr(second, name)))
