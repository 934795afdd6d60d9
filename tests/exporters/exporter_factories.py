"""Factories for the exporter tests: GPU states, snapshots and an H100 MIG geometry.

Hand-built snapshots pin exact values (a temperature, a throttle bitmask); tests that need the
whole stack use ``make_node`` from the top-level conftest instead.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from nodeagent.agent.backend import open_node
from nodeagent.gpu.types import (
    ClockEventReason,
    ComputeInstance,
    EccCounts,
    GpuInfo,
    GpuInstance,
    GpuState,
    Link,
    LinkKind,
    MigGeometry,
    NodeSnapshot,
    NvLinkStatus,
    Placement,
    ProcessInfo,
    RemappedRows,
    Telemetry,
)

GIB = 1 << 30
MIB = 1 << 20


def _simulated_h100_geometry() -> MigGeometry:
    """The H100-80GB MIG geometry as the simulator reports it through the GPU layer."""
    with tempfile.TemporaryDirectory() as tmp:
        node = open_node(simulate="dgx-h100", state_dir=Path(tmp))
        try:
            geometry = node.mig_geometry(0)
        finally:
            node.close()
    assert geometry is not None
    return geometry


H100_GEOMETRY = _simulated_h100_geometry()


def gpu_uuid(index: int) -> str:
    return f"GPU-{index:08x}-0000-0000-0000-000000000000"


def telemetry(index: int, **overrides: object) -> Telemetry:
    base = Telemetry(
        gpu_index=index,
        timestamp_s=1000.0,
        utilization_gpu_ratio=0.5,
        utilization_memory_ratio=0.25,
        memory_used_bytes=GIB,
        memory_free_bytes=79 * GIB - 512 * MIB,
        memory_reserved_bytes=512 * MIB,
        temperature_celsius=41.0,
        temperature_slowdown_celsius=90.0,
        power_watts=120.5,
        power_limit_watts=700.0,
        energy_joules=123456.0,
        sm_clock_hz=1.98e9,
        memory_clock_hz=2.619e9,
        clock_event_reasons=ClockEventReason.GPU_IDLE,
        ecc=EccCounts(1, 0, 5, 0),
        remapped_rows=RemappedRows(0, 0, pending=False, failure=False),
        retired_pages_sbe=None,
        retired_pages_dbe=None,
        retired_pages_pending=None,
        pcie_replay_count=0,
        nvlinks=tuple(NvLinkStatus(n, True, 0, 0, 0) for n in range(2)),
        processes=(),
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


def instance(gpu: int, gi_id: int, profile: str, start: int, size: int, busy: bool = False):
    mig_uuid = f"MIG-{gpu:04x}{gi_id:04x}-0000-0000-0000-000000000000"
    ci = ComputeInstance(gi_id, 0, 0, size, Placement(0, size), mig_uuid)
    return GpuInstance(gpu, gi_id, profile, 0, Placement(start, size), (ci,), (42,) if busy else ())


def gpu_state(
    index: int,
    *,
    mig: Sequence[GpuInstance] | None = None,
    lost: bool = False,
    processes: int = 0,
    **tele: object,
) -> GpuState:
    info = GpuInfo(
        index=index,
        uuid=gpu_uuid(index),
        name="NVIDIA H100 80GB HBM3",
        serial=None,
        pci_bus_id=f"00000000:{0x18 + index:02X}:00.0",
        pci_device_id=0x233010DE,
        numa_node=0,
        memory_total_bytes=80 * GIB,
        compute_capability=(9, 0),
        driver_version="570.124.06",
        cuda_driver_version="12.8",
        vbios_version="96.00.99.00.01",
        mig_capable=True,
        mig_enabled=mig is not None,
        mig_pending=mig is not None,
    )
    if lost:
        return GpuState(info, None, (), lost=True, error="GPU is lost")
    procs = tuple(
        ProcessInfo(100 + p, GIB, None, None, "python3", 0.3, 0.2) for p in range(processes)
    )
    return GpuState(
        info,
        telemetry(index, processes=procs, **tele),
        tuple(mig or ()),
        mig_geometry=H100_GEOMETRY if mig is not None else None,
    )


def snapshot(gpus: Sequence[GpuState], *, nvlink: bool = True, **kw: object) -> NodeSnapshot:
    topo: dict[tuple[int, int], Link] = {}
    for a in gpus:
        for b in gpus:
            i, j = a.info.index, b.info.index
            if i != j:
                topo[(i, j)] = Link(LinkKind.NVLINK, 18) if nvlink else Link(LinkKind.SYSTEM)
    fields: dict[str, object] = {
        "timestamp_s": 1000.0,
        "sample_duration_s": 0.004,
        "driver_version": "570.124.06",
        "cuda_driver_version": "12.8",
        "gpus": tuple(gpus),
        "topology": topo,
    }
    fields.update(kw)
    return NodeSnapshot(**fields)  # type: ignore[arg-type]


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse_samples(text: str) -> Samples:
    """Every sample of an exposition, keyed by (name, label set)."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The value of the one sample of ``name`` whose labels include ``labels``."""
    hits = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls)]
    assert len(hits) <= 1, f"{name}{labels} matches {len(hits)} samples"
    return hits[0] if hits else None
