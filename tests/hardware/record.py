"""Print what the real GPUs report, for the facts the simulator models, and read nothing more.

Inventory; temperature thresholds; memory with what the driver reserves (memory info v2); the
MIG mode and whether the driver lists MIG profiles while it is off; the MIG profile table (memory,
SMs, engines) with the placements in the order NVML returns them; the GPU instances that exist,
with their IDs; how many more of each profile NVML says fit beside them (what the media-engine
and capacity rules decide); the MIG device count; the topology.

Read-only: it never creates or destroys an instance and never changes MIG mode, clocks, power
limits, compute or persistence mode, and never resets a GPU. Usage::

    python tests/hardware/record.py                       # JSON
    python tests/hardware/record.py --markdown            # tables for docs/hardware.md
    python tests/hardware/record.py --simulate dgx-h100   # the same record of a simulated node
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import sys
from typing import Any

from nodeagent.agent.backend import open_node
from nodeagent.gpu.errors import GpuError
from nodeagent.gpu.node import GpuNode
from nodeagent.gpu.types import GeometrySource, MigGeometry

MIB = 1 << 20
THRESHOLDS = {
    "slowdown": "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN",
    "shutdown": "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN",
    "gpu_max": "NVML_TEMPERATURE_THRESHOLD_GPU_MAX",
}


def _read(nvml: Any, function: str, *args: Any) -> Any:
    """One NVML reading, or ``None`` where the driver does not give it (any NVML error)."""
    try:
        return getattr(nvml, function)(*args)
    except nvml.NVMLError:
        return None


def _placements_as_listed(nvml: Any, handle: Any, profile_id: int) -> list[list[int]] | int:
    """The profile's possible placements in the order NVML returns them, or its error code."""
    count = ctypes.c_uint(0)
    fn = nvml.nvmlDeviceGetGpuInstancePossiblePlacements
    try:
        fn(handle, profile_id, None, ctypes.byref(count))  # NULL: how many there are
        buffer = (nvml.c_nvmlGpuInstancePlacement_t * count.value)()
        fn(handle, profile_id, buffer, ctypes.byref(count))
    except nvml.NVMLError as exc:
        return int(exc.value)
    return [[int(p.start), int(p.size)] for p in buffer[: count.value]]


def _mig(node: GpuNode, index: int, handle: Any, enabled: bool) -> dict[str, Any] | None:
    geometry: MigGeometry | None = node.mig_geometry(index)
    if geometry is None:
        return None
    nvml = node.nvml
    profiles = []
    for p in geometry.profiles:
        row = dataclasses.asdict(p)
        row["memory_mib"] = p.memory_bytes // MIB
        row["placements_as_listed"] = _placements_as_listed(nvml, handle, p.profile_id)
        if enabled:
            row["remaining"] = _read(
                nvml, "nvmlDeviceGetGpuInstanceRemainingCapacity", handle, p.profile_id
            )
        profiles.append(row)
    instances = [
        {
            "instance_id": g.instance_id,
            "profile": g.profile,
            "start": g.placement.start,
            "size": g.placement.size,
            "busy": g.busy,
        }
        for g in (node.mig_instances(index) if enabled else ())
    ]
    return {
        # "catalog": the driver listed no profile while MIG is off, nodeagent's catalog stood in
        "source": geometry.source.value,
        "memory_slices": geometry.memory_slices,
        "profiles": profiles,
        "instances": instances,
    }


def collect(node: GpuNode) -> dict[str, Any]:
    """Everything recorded, as plain JSON-able data."""
    nvml = node.nvml
    snapshot = node.snapshot()
    gpus: list[dict[str, Any]] = []
    for state in snapshot.gpus:
        info = state.info
        handle = nvml.nvmlDeviceGetHandleByIndex(info.index)
        t = state.telemetry
        thresholds = {
            name: _read(nvml, "nvmlDeviceGetTemperatureThreshold", handle, getattr(nvml, const))
            for name, const in THRESHOLDS.items()
        }
        gpus.append(
            {
                "info": dataclasses.asdict(info),
                "lost": state.lost,
                "error": state.error,
                "thresholds_celsius": thresholds,
                "memory_mib": None
                if t is None
                else {
                    "total": info.memory_total_bytes // MIB,
                    "used": t.memory_used_bytes // MIB,
                    "reserved": None
                    if t.memory_reserved_bytes is None
                    else t.memory_reserved_bytes // MIB,
                    "free": t.memory_free_bytes // MIB,
                },
                "utilization_gpu_ratio": None if t is None else t.utilization_gpu_ratio,
                "max_mig_devices": _read(nvml, "nvmlDeviceGetMaxMigDeviceCount", handle),
                "mig": _mig(node, info.index, handle, info.mig_enabled),
            }
        )
    return {
        "driver_version": snapshot.driver_version,
        "cuda_driver_version": snapshot.cuda_driver_version,
        "gpus": gpus,
        "topology": {f"{i},{j}": link.label for (i, j), link in sorted(snapshot.topology.items())},
    }


def _cell(value: object) -> str:
    return "-" if value is None else str(value)


def _inventory(record: dict[str, Any]) -> list[str]:
    lines = [
        "| GPU | name | PCI id | CC | memory MiB | reserved MiB | slowdown/shutdown/max C "
        "| MIG (cur/pend) | MIG devices | util |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for gpu in record["gpus"]:
        i, mem, th = gpu["info"], gpu["memory_mib"] or {}, gpu["thresholds_celsius"]
        mig = f"{i['mig_enabled']}/{i['mig_pending']}" if i["mig_capable"] else "no"
        util = gpu["utilization_gpu_ratio"]
        lines.append(
            f"| {i['index']} | {i['name']} | {i['pci_device_id']:#010x} | "
            f"{i['compute_capability'][0]}.{i['compute_capability'][1]} | "
            f"{i['memory_total_bytes'] // MIB} | {_cell(mem.get('reserved'))} | "
            f"{_cell(th['slowdown'])}/{_cell(th['shutdown'])}/{_cell(th['gpu_max'])} | {mig} | "
            f"{_cell(gpu['max_mig_devices'])} | {'N/A' if util is None else f'{util:.2f}'} |"
        )
    return lines


def _profiles(gpu: dict[str, Any]) -> list[str]:
    mig = gpu["mig"]
    enabled = gpu["info"]["mig_enabled"]
    source = "the driver" if mig["source"] == GeometrySource.DRIVER.value else "nodeagent's catalog"
    lines = [
        "",
        f"GPU {gpu['info']['index']} MIG profiles ({mig['memory_slices']} slices; MIG "
        f"{'on' if enabled else 'off'}; table from {source}):",
        "",
        "| profile | ID | index | slices | SMs | MiB | max | CE/DEC/JPG/OFA "
        "| placements (NVML order) | remaining |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in mig["profiles"]:
        listed = p["placements_as_listed"]
        placements = (
            f"NVML error {listed}"
            if isinstance(listed, int)
            else " ".join(f"{s}:{n}" for s, n in listed)
        )
        lines.append(
            f"| {p['name']} | {p['profile_id']} | {p['nvml_index']} | {p['slices']} | "
            f"{p['multiprocessors']} | {p['memory_mib']} | {p['max_count']} | "
            f"{p['copy_engines']}/{p['decoders']}/{p['jpeg_decoders']}/{p['ofa']} | "
            f"{placements or '-'} | {_cell(p.get('remaining'))} |"
        )
    if mig["instances"]:
        lines += ["", "| GPU instance ID | profile | placement | busy |", "|---|---|---|---|"]
        lines += [
            f"| {g['instance_id']} | {g['profile']} | {g['start']}:{g['size']} | {g['busy']} |"
            for g in mig["instances"]
        ]
    return lines


def markdown(record: dict[str, Any]) -> str:
    """The record as markdown tables."""
    lines = [f"Driver {record['driver_version']}, CUDA {record['cuda_driver_version']}", ""]
    lines += _inventory(record)
    for gpu in record["gpus"]:
        mig = gpu["mig"]
        if mig is None or not mig["profiles"]:
            continue
        if mig["source"] == GeometrySource.DRIVER.value:
            lines += _profiles(gpu)
            continue
        # The catalog's table is nodeagent's own: what is worth recording is what NVML answered.
        codes = sorted(
            {c for p in mig["profiles"] if isinstance(c := p["placements_as_listed"], int)}
        )
        answer = f"refused (NVML error {', '.join(map(str, codes))})" if codes else "listed"
        lines += [
            "",
            f"GPU {gpu['info']['index']}: MIG off; the driver lists no MIG profile while MIG is "
            f"off (nodeagent's catalog stands in); possible placements {answer}.",
        ]
    if record["topology"]:
        lines += ["", "Topology: " + ", ".join(f"{k}={v}" for k, v in record["topology"].items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the record; exit 2 when there is no NVML."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print markdown tables")
    parser.add_argument("--simulate", metavar="PRESET", help="record a simulated node instead")
    args = parser.parse_args(argv)
    try:
        with open_node(simulate=args.simulate) as node:
            record = collect(node)
    except GpuError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(markdown(record) if args.markdown else json.dumps(record, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
