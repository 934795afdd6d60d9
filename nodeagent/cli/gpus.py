"""``nodeagent gpus`` and ``nodeagent topo``: inventory and the topology matrix."""

from __future__ import annotations

import sys
from typing import Any

import typer

from nodeagent.cli.common import (
    EXIT_DRIFT,
    JsonOption,
    SimulateOption,
    StateDirOption,
    emit_json,
    gib,
    open_node_or_exit,
    print_table,
)
from nodeagent.gpu.errors import GpuLost
from nodeagent.gpu.types import GpuInfo, Link


def gpu_to_json(info: GpuInfo) -> dict[str, Any]:
    """The documented JSON shape of one GPU (docs/cli.md)."""
    return {
        "index": info.index,
        "lost": False,
        "uuid": info.uuid,
        "name": info.name,
        "serial": info.serial,
        "pci_bus_id": info.pci_bus_id,
        "pci_device_id": f"0x{info.pci_device_id:08X}",
        "numa_node": info.numa_node,
        "memory_total_bytes": info.memory_total_bytes,
        "compute_capability": f"{info.compute_capability[0]}.{info.compute_capability[1]}",
        "driver_version": info.driver_version,
        "cuda_driver_version": info.cuda_driver_version,
        "vbios_version": info.vbios_version,
        "mig_capable": info.mig_capable,
        "mig_enabled": info.mig_enabled,
        "mig_pending": info.mig_pending,
    }


def _mig_mode_cell(info: GpuInfo) -> str:
    if not info.mig_capable:
        return "n/a"
    state = "on" if info.mig_enabled else "off"
    if info.mig_change_pending:
        state += f" (pending {'on' if info.mig_pending else 'off'}: reset required)"
    return state


def gpus(
    simulate: SimulateOption = None, state_dir: StateDirOption = None, as_json: JsonOption = False
) -> None:
    """List the node's GPUs: model, memory, PCI and NUMA placement, driver, MIG mode."""
    node = open_node_or_exit(simulate, state_dir)
    gpus: list[GpuInfo | tuple[int, str]] = []  # info, or (index, error) for a lost GPU
    try:
        for index in range(node.count()):
            try:
                gpus.append(node.info(index))
            except GpuLost as exc:
                # A GPU that fell off the bus still counts: show it, don't hide it.
                gpus.append((index, str(exc)))
    finally:
        node.close()
    if as_json:
        emit_json(
            [
                gpu_to_json(g)
                if isinstance(g, GpuInfo)
                else {"index": g[0], "lost": True, "error": g[1]}
                for g in gpus
            ]
        )
    else:
        rows = [
            [
                str(g.index),
                g.name,
                f"{gib(g.memory_total_bytes)} GiB",
                g.pci_bus_id,
                "-" if g.numa_node is None else str(g.numa_node),
                g.driver_version,
                _mig_mode_cell(g),
                g.uuid,
            ]
            if isinstance(g, GpuInfo)
            else [
                str(g[0]),
                "LOST (GPU is lost: fallen off the bus?)",
                "-",
                "-",
                "-",
                "-",
                "-",
                "-",
            ]
            for g in gpus
        ]
        print_table(["GPU", "NAME", "MEMORY", "PCI BUS", "NUMA", "DRIVER", "MIG", "UUID"], rows)
    if any(not isinstance(g, GpuInfo) for g in gpus):
        raise typer.Exit(EXIT_DRIFT)


def topology_to_json(
    count: int, links: dict[tuple[int, int], Link], lost: frozenset[int] = frozenset()
) -> dict[str, Any]:
    """The documented JSON shape of the topology (docs/cli.md).

    Every unordered pair is listed; a pair with a lost GPU, whose link cannot be read, is
    ``{"kind": "unknown", "label": "?", "lost": true}`` rather than left out.
    """
    out = []
    for a in range(count):
        for b in range(a + 1, count):
            link = links.get((a, b))
            if link is not None:
                entry = {
                    "a": a,
                    "b": b,
                    "kind": link.kind.name.lower(),
                    "label": link.label,
                    "nvlinks": link.nvlink_count,
                    "lost": False,
                }
            else:
                entry = {"a": a, "b": b, "kind": "unknown", "label": "?", "nvlinks": 0}
                entry["lost"] = a in lost or b in lost
            out.append(entry)
    return {"gpus": count, "lost": sorted(lost), "links": out}


def topo(
    simulate: SimulateOption = None, state_dir: StateDirOption = None, as_json: JsonOption = False
) -> None:
    """Show how every pair of GPUs is connected, as `nvidia-smi topo -m` does."""
    node = open_node_or_exit(simulate, state_dir)
    try:
        count = node.count()
        links = node.topology()
        numa = {info.index: info.numa_node for info in node.inventory()}
    finally:
        node.close()
    # The inventory leaves out the GPUs that do not answer.
    lost = frozenset(range(count)) - frozenset(numa)
    if as_json:
        # Exit 0 with a lost GPU, as the table does: the matrix marks it; `gpus` fails on it.
        emit_json(topology_to_json(count, links, lost))
        return
    headers = [""] + [f"GPU{j}" for j in range(count)] + ["NUMA"]
    rows = []
    for i in range(count):
        # A lost GPU has no links to show: "?" rather than a guess.
        cells = [
            "X" if i == j else (links[(i, j)].label if (i, j) in links else "?")
            for j in range(count)
        ]
        name = f"GPU{i}" + (" LOST" if i in lost else "")
        rows.append([name, *cells, "-" if numa.get(i) is None else str(numa[i])])
    print_table(headers, rows)
    sys.stdout.write(
        "\nLegend: X = self, ? = unknown (GPU lost), NV# = # NVLinks, PIX = one PCIe bridge,\n"
        "PXB = several PCIe bridges, PHB = PCIe host bridge, NODE = host bridges within a NUMA\n"
        "node, SYS = across NUMA nodes\n"
    )
