"""Pure helpers for GPU topology: PCI bus ids and NVML topology levels."""

from __future__ import annotations

from nodeagent.gpu.types import LinkKind

# nvmlGpuTopologyLevel_t values (nvml.h) -> the nvidia-smi topo vocabulary.
TOPOLOGY_LEVELS: dict[int, LinkKind] = {
    0: LinkKind.SELF,  # NVML_TOPOLOGY_INTERNAL: same board
    10: LinkKind.PCIE_SINGLE,  # NVML_TOPOLOGY_SINGLE: one PCIe switch
    20: LinkKind.PCIE_MULTIPLE,  # NVML_TOPOLOGY_MULTIPLE: several switches, no host bridge
    30: LinkKind.PCIE_HOSTBRIDGE,  # NVML_TOPOLOGY_HOSTBRIDGE: same host bridge
    40: LinkKind.NODE,  # NVML_TOPOLOGY_NODE (alias CPU): same NUMA node
    50: LinkKind.SYSTEM,  # NVML_TOPOLOGY_SYSTEM: across the SMP interconnect
}


def link_kind_for_level(level: int) -> LinkKind:
    """The link kind for an NVML topology level.

    A level this table does not know (a newer driver's finer level) is reported as the farthest
    kind, SYS, so that placement code never treats an unknown path as close.
    """
    return TOPOLOGY_LEVELS.get(level, LinkKind.SYSTEM)


def normalize_bus_id(bus_id: str) -> str:
    """A PCI bus id in one canonical form, ``00000000:18:00.0`` (8-digit domain, lower case).

    NVML reports ``busId`` with an 8-digit domain and ``busIdLegacy`` with 4; NVLink remote PCI
    info may use either, so ids are compared in this form.
    """
    text = bus_id.strip().lower()
    parts = text.split(":")
    if len(parts) == 3:
        domain, bus, devfn = parts
    elif len(parts) == 2:
        domain, (bus, devfn) = "0", parts
    else:
        return text
    try:
        return f"{int(domain, 16):08x}:{int(bus, 16):02x}:{devfn}"
    except ValueError:
        return text
