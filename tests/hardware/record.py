"""Print what the real GPUs report: inventory, MIG profile table with placements, topology.

Read-only (it changes no GPU setting). Usage::

    python tests/hardware/record.py            # JSON
    python tests/hardware/record.py --markdown # tables for docs/hardware.md
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from nodeagent.agent.backend import open_node
from nodeagent.gpu.errors import GpuError
from nodeagent.gpu.node import GpuNode


def collect(node: GpuNode) -> dict[str, Any]:
    """Everything recorded, as plain JSON-able data."""
    gpus: list[dict[str, Any]] = []
    for info in node.inventory():
        geometry = node.mig_geometry(info.index)
        gpus.append(
            {
                "info": dataclasses.asdict(info),
                "mig_profiles": [dataclasses.asdict(p) for p in geometry.profiles]
                if geometry
                else None,
                "memory_slices": geometry.memory_slices if geometry else None,
            }
        )
    return {
        "driver_version": node.driver_version(),
        "cuda_driver_version": node.cuda_driver_version(),
        "gpus": gpus,
        "topology": {f"{i},{j}": link.label for (i, j), link in sorted(node.topology().items())},
    }


def markdown(record: dict[str, Any]) -> str:
    """The record as markdown tables."""
    lines = [f"Driver {record['driver_version']}, CUDA {record['cuda_driver_version']}", ""]
    lines += ["| GPU | name | memory MiB | CC | PCI id | bus id | NUMA | MIG (cur/pend) |"]
    lines += ["|---|---|---|---|---|---|---|---|"]
    for gpu in record["gpus"]:
        i = gpu["info"]
        mig = f"{i['mig_enabled']}/{i['mig_pending']}" if i["mig_capable"] else "no"
        lines.append(
            f"| {i['index']} | {i['name']} | {i['memory_total_bytes'] // 2**20} | "
            f"{i['compute_capability'][0]}.{i['compute_capability'][1]} | "
            f"{i['pci_device_id']:#010x} | {i['pci_bus_id']} | {i['numa_node']} | {mig} |"
        )
    for gpu in record["gpus"]:
        if not gpu["mig_profiles"]:
            continue
        lines += ["", f"GPU {gpu['info']['index']} MIG profiles ({gpu['memory_slices']} slices):"]
        lines += [
            "",
            "| profile | ID | index | slices | SMs | MiB | max | CE/DEC/JPG/OFA | placements |",
        ]
        lines += ["|---|---|---|---|---|---|---|---|---|"]
        for p in gpu["mig_profiles"]:
            placements = " ".join(f"{q['start']}:{q['size']}" for q in p["placements"]) or "-"
            lines.append(
                f"| {p['name']} | {p['profile_id']} | {p['nvml_index']} | {p['slices']} | "
                f"{p['multiprocessors']} | {p['memory_bytes'] // 2**20} | {p['max_count']} | "
                f"{p['copy_engines']}/{p['decoders']}/{p['jpeg_decoders']}/{p['ofa']} | "
                f"{placements} |"
            )
    if record["topology"]:
        lines += ["", "Topology: " + ", ".join(f"{k}={v}" for k, v in record["topology"].items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the record; exit 2 when there is no NVML."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
