"""Hand-built GPM profiling figures for exporter tests."""

from __future__ import annotations

from dataclasses import replace

from nodeagent.gpu.types import GpuInstance, GpuState, Profiling


def profiling(sm: float = 0.5, *, whole_gpu: bool = True) -> Profiling:
    """Figures of a device whose SMs are ``sm`` busy; PCIe and NVLink only for a whole GPU."""
    link = 1.0e9 if whole_gpu else None
    return Profiling(
        interval_s=1.0,
        graphics_active_ratio=min(1.0, sm / 0.85),
        sm_active_ratio=sm,
        sm_occupancy_ratio=sm * 0.5,
        tensor_active_ratio=sm * 0.6,
        dram_active_ratio=sm * 0.4,
        fp64_active_ratio=0.01,
        fp32_active_ratio=sm * 0.25,
        fp16_active_ratio=sm * 0.1,
        pcie_tx_bytes_per_second=link,
        pcie_rx_bytes_per_second=link,
        nvlink_tx_bytes_per_second=link,
        nvlink_rx_bytes_per_second=link,
    )


def with_profiling(gpu: GpuState, sm: float = 0.5) -> GpuState:
    """``gpu`` with figures for itself and each of its MIG instances."""
    instances = tuple(with_instance_profiling(gi, sm) for gi in gpu.mig_instances)
    return replace(gpu, profiling=profiling(sm), mig_instances=instances)


def with_instance_profiling(gi: GpuInstance, sm: float = 0.5) -> GpuInstance:
    """``gi`` with its own figures (no PCIe or NVLink, as NVML gives them)."""
    return replace(gi, profiling=profiling(sm, whole_gpu=False))
