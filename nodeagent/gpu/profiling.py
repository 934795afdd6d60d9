"""Profiling figures through NVML's GPM (GPU Performance Monitoring), Hopper and later.

GPM works on samples: ``nvmlGpmSampleGet`` (whole GPU) or ``nvmlGpmMigSampleGet`` (one GPU
instance) copies the hardware counters into a buffer, and ``nvmlGpmMetricsGet`` computes
metrics from two buffers. The reader keeps two buffers per GPU and per GPU instance and
alternates them: each pass takes one new sample and computes the metrics between it and the
previous pass's sample, so every interval is covered exactly once, with one sample per device
and per instance per pass and no sleep inside the sampler. The first pass therefore has no
figures yet (``None``).

Support is asked once per GPU (``nvmlGpmQueryDeviceSupport``); a GPU without GPM (before
Hopper, or a driver before R520) is logged once and never sampled again, and its figures stay
``None``: nothing is exported for it rather than zeros.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from nodeagent.gpu import errors
from nodeagent.gpu.errors import GpuError, GpuLost
from nodeagent.gpu.nvml import Nvml
from nodeagent.gpu.types import GpuInstance, Profiling

log = logging.getLogger(__name__)

MIB = 1024 * 1024

# The Profiling field each GPM metric fills, with the factor from NVML's unit to ours
# (percent to a 0..1 ratio, MiB/s to bytes/s). Metric ids are nvml.h's NVML_GPM_METRIC_*
# values, read through the module so a binding's own constants are used.
_METRICS: tuple[tuple[str, str, float], ...] = (
    ("NVML_GPM_METRIC_GRAPHICS_UTIL", "graphics_active_ratio", 0.01),
    ("NVML_GPM_METRIC_SM_UTIL", "sm_active_ratio", 0.01),
    ("NVML_GPM_METRIC_SM_OCCUPANCY", "sm_occupancy_ratio", 0.01),
    ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", "tensor_active_ratio", 0.01),
    ("NVML_GPM_METRIC_DRAM_BW_UTIL", "dram_active_ratio", 0.01),
    ("NVML_GPM_METRIC_FP64_UTIL", "fp64_active_ratio", 0.01),
    ("NVML_GPM_METRIC_FP32_UTIL", "fp32_active_ratio", 0.01),
    ("NVML_GPM_METRIC_FP16_UTIL", "fp16_active_ratio", 0.01),
    ("NVML_GPM_METRIC_PCIE_TX_PER_SEC", "pcie_tx_bytes_per_second", MIB),
    ("NVML_GPM_METRIC_PCIE_RX_PER_SEC", "pcie_rx_bytes_per_second", MIB),
    ("NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", "nvlink_tx_bytes_per_second", MIB),
    ("NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC", "nvlink_rx_bytes_per_second", MIB),
)
# nvml.h's ids, for a binding that lacks the constants (they are fixed in the ABI).
_DEFAULT_IDS = {
    "NVML_GPM_METRIC_GRAPHICS_UTIL": 1,
    "NVML_GPM_METRIC_SM_UTIL": 2,
    "NVML_GPM_METRIC_SM_OCCUPANCY": 3,
    "NVML_GPM_METRIC_ANY_TENSOR_UTIL": 5,
    "NVML_GPM_METRIC_DRAM_BW_UTIL": 10,
    "NVML_GPM_METRIC_FP64_UTIL": 11,
    "NVML_GPM_METRIC_FP32_UTIL": 12,
    "NVML_GPM_METRIC_FP16_UTIL": 13,
    "NVML_GPM_METRIC_PCIE_TX_PER_SEC": 20,
    "NVML_GPM_METRIC_PCIE_RX_PER_SEC": 21,
    "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC": 60,
    "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC": 61,
}
# Answers that mean "no GPM here": the device lacks it, or the driver lacks the entry point.
_UNSUPPORTED = errors.ABSENT_CODES | {errors.NVML_ERROR_FUNCTION_NOT_FOUND}

DEFAULT_INTERVAL_S = 0.0  # every pass; the agent sets its own (sampler.profiling_interval_s)

# A GPU's key is (gpu, None); a GPU instance's also holds its profile and placement, so an
# instance destroyed and created again under the same id starts afresh.
Key = tuple[int, int | None, int, int]


@dataclass(slots=True)
class _Buffers:
    """Two sample buffers of one GPU or instance: ``previous`` holds the last pass's sample."""

    previous: Any
    spare: Any
    taken_at: float | None = None  # when ``previous`` was taken; None: not taken yet


class ProfilingReader:
    """GPM figures of GPUs and their GPU instances, one interval per pass.

    Used from the sampler thread only (the buffers and the request struct are reused).
    """

    def __init__(self, nvml: Nvml, clock: Callable[[], float] = time.monotonic) -> None:
        self._nvml = nvml
        self._clock = clock
        self.enabled = True
        # GPM is sampled at most this often (0: every pass); between, a snapshot carries the
        # figures of the last complete interval. A longer interval costs less and gives the
        # mean over it, which is what a scrape every 15 s wants anyway.
        self.interval_s = DEFAULT_INTERVAL_S
        self._next_due: dict[int, float] = {}
        self._last: dict[Key, Profiling | None] = {}
        self._supported: dict[int, bool] = {}
        self._buffers: dict[Key, _Buffers] = {}
        self._request: Any = None
        self._ids = tuple(nvml.const(name, _DEFAULT_IDS[name]) for name, _, _ in _METRICS)

    # --- support ------------------------------------------------------------------------------
    def supported(self, index: int) -> bool:
        """Whether GPU ``index`` has GPM (asked once; the answer is logged once when it is no)."""
        known = self._supported.get(index)
        if known is not None:
            return known
        handle = self._nvml.handle(index)
        support, code = self._nvml.attempt(
            "nvmlGpmQueryDeviceSupport", handle, gpu=index, expected=_UNSUPPORTED
        )
        answer = support is not None and bool(support.isSupportedDevice)
        if not answer:
            why = (
                "the driver has no GPM (R520 or newer needed)"
                if code == errors.NVML_ERROR_FUNCTION_NOT_FOUND
                else "GPM needs a Hopper or newer GPU"
            )
            log.info(
                "GPU %d: profiling metrics not supported (%s); none exported for it", index, why
            )
        self._supported[index] = answer
        return answer

    # --- sampling -----------------------------------------------------------------------------
    def read(
        self, index: int, instances: tuple[GpuInstance, ...]
    ) -> tuple[Profiling | None, tuple[GpuInstance, ...]]:
        """GPU ``index``'s figures and its instances carrying theirs: fresh when a GPM interval
        has passed (one sample each), else the last interval's (no NVML call)."""
        self.forget(index, instances)
        if not self.enabled:
            return None, instances
        try:
            supported = self.supported(index)
        except GpuLost:
            raise
        except GpuError as exc:
            # The question failed (not "no"): no figures this pass, and it is asked again.
            log.debug("GPU %d: GPM support query failed: %s", index, exc)
            return None, instances
        if not supported:
            return None, instances
        now = self._clock()
        if now >= self._next_due.get(index, now):
            self._next_due[index] = now + self.interval_s
            gpu = self.gpu(index)
            return gpu, self.with_profiling(index, instances)
        last = self._last.get((index, None, 0, 0))
        carried = []
        for gi in instances:
            figures = self._last.get(_key(index, gi))
            carried.append(gi if figures is None else _with(gi, figures))
        return last, tuple(carried)

    def gpu(self, index: int) -> Profiling | None:
        """The whole GPU's figures since the previous call (``None``: first call, or no GPM)."""
        if not self.enabled or not self.supported(index):
            return None
        handle = self._nvml.handle(index)
        return self._interval((index, None, 0, 0), "nvmlGpmSampleGet", (handle,), index)

    def instance(self, index: int, instance: GpuInstance) -> Profiling | None:
        """One GPU instance's figures since the previous call (``nvmlGpmMigSampleGet``)."""
        if not self.enabled or not self.supported(index):
            return None
        key = _key(index, instance)
        handle = self._nvml.handle(index)
        args = (handle, instance.instance_id)
        return self._interval(key, "nvmlGpmMigSampleGet", args, index)

    def with_profiling(
        self, index: int, instances: tuple[GpuInstance, ...]
    ) -> tuple[GpuInstance, ...]:
        """``instances`` carrying their figures, sampled now."""
        if not self.enabled or not self.supported(index):
            return instances
        out = []
        for gi in instances:
            profiling = self.instance(index, gi)
            out.append(gi if profiling is None else _with(gi, profiling))
        return tuple(out)

    def _interval(
        self, key: Key, function: str, args: tuple[Any, ...], index: int
    ) -> Profiling | None:
        figures = self._sample(key, function, args, index)
        self._last[key] = figures
        return figures

    def _sample(
        self, key: Key, function: str, args: tuple[Any, ...], index: int
    ) -> Profiling | None:
        nvml = self._nvml
        buffers = self._buffers.get(key)
        try:
            if buffers is None:
                buffers = _Buffers(nvml.call("nvmlGpmSampleAlloc"), nvml.call("nvmlGpmSampleAlloc"))
                self._buffers[key] = buffers
            now = self._clock()
            _, code = nvml.attempt(function, *args, buffers.spare, gpu=index, expected=_UNSUPPORTED)
            if code != errors.NVML_SUCCESS:
                # This GPU has GPM but not this reading now (an instance on its way out, a
                # mode the driver does not sample in): no figures, and start over next pass.
                buffers.taken_at = None
                return None
            previous_at = buffers.taken_at
            buffers.previous, buffers.spare = buffers.spare, buffers.previous
            buffers.taken_at = now
            if previous_at is None:
                return None
            return self._metrics(buffers.spare, buffers.previous, now - previous_at, index)
        except GpuLost:
            raise
        except GpuError as exc:
            # One failed reading spoils this interval only; the next pass starts afresh.
            log.debug("GPU %d: GPM %s failed: %s", index, function, exc)
            if buffers is not None:
                buffers.taken_at = None
            return None

    def _metrics(self, first: Any, second: Any, interval_s: float, index: int) -> Profiling:
        module = self._nvml.module
        request = self._request
        if request is None:
            request = self._request = module.c_nvmlGpmMetricsGet_t()
            request.version = module.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(self._ids)
            for slot, metric_id in enumerate(self._ids):
                request.metrics[slot].metricId = metric_id
        request.sample1, request.sample2 = first, second
        answer = self._nvml.call("nvmlGpmMetricsGet", request, gpu=index)
        figures: dict[str, float | None] = {}
        for slot, (_, field, factor) in enumerate(_METRICS):
            metric = answer.metrics[slot]
            ok = int(metric.nvmlReturn) == errors.NVML_SUCCESS
            figures[field] = float(metric.value) * factor if ok else None
        return Profiling(interval_s=interval_s, **figures)

    # --- lifetime -----------------------------------------------------------------------------
    def forget(self, index: int, alive: Iterable[GpuInstance]) -> None:
        """Release the buffers of GPU ``index``'s instances that are no longer there."""
        keep = {_key(index, gi) for gi in alive}
        for key in [k for k in self._buffers if k[0] == index and k[1] is not None]:
            if key not in keep:
                self._release(self._buffers.pop(key))
                self._last.pop(key, None)

    def _release(self, buffers: _Buffers) -> None:
        for sample in (buffers.previous, buffers.spare):
            try:
                self._nvml.call("nvmlGpmSampleFree", sample)
            except GpuError as exc:
                log.debug("GPM sample could not be freed: %s", exc)

    def close(self) -> None:
        """Free every sample buffer (before NVML shuts down)."""
        for buffers in self._buffers.values():
            self._release(buffers)
        self._buffers.clear()
        self._last.clear()


def _key(index: int, instance: GpuInstance) -> Key:
    return (index, instance.instance_id, instance.profile_id, instance.placement.start)


def _with(instance: GpuInstance, profiling: Profiling) -> GpuInstance:
    """The instance with its figures (``profiling`` is not part of its identity)."""
    return replace(instance, profiling=profiling)
