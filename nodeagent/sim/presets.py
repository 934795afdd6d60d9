"""Node presets: which GPUs a simulated node has and how they are wired.

A preset is turned into the initial state of a simulated node (see :mod:`nodeagent.sim.state`).
Identities (UUID, serial, PCI bus id) are derived from the preset name and the GPU index, so
the same preset always yields the same node.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from typing import Any

import pynvml

from nodeagent.sim.models import MODELS

DRIVER_VERSION = "570.124.06"
CUDA_DRIVER_VERSION = 12080  # what nvmlSystemGetCudaDriverVersion returns for CUDA 12.8
NVML_VERSION = "12.570.124.06"

# PCI buses of the GPUs on an 8-GPU HGX board (DGX A100/H100 use these), one per GPU.
_HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_PCIE_BUSES = (0x17, 0x31, 0x4B, 0x65, 0x98, 0xB1, 0xCA, 0xE3)


@dataclass(frozen=True, slots=True)
class Preset:
    """A simulated node layout."""

    name: str
    description: str
    model: str  # key into models.MODELS; every GPU of a preset is the same model
    gpus: int
    fabric: str  # "nvswitch", "bridge-pairs" or "pcie"
    buses: tuple[int, ...]
    switch_chips: int = 0  # NVSwitch chips on the board; 0: 6 for 12-link GPUs, else 4
    # The machine's DMI product name (/sys/class/dmi/id/product_name), which GFD publishes as
    # nvidia.com/gpu.machine: DGX systems' own names, "Simulated ..." for the OEM boards.
    machine: str = "Simulated GPU server"

    def numa_node(self, index: int) -> int:
        """NUMA node of a GPU: the lower half of an 8-GPU node sits on node 0."""
        return 0 if self.gpus < 8 or index < self.gpus // 2 else 1


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("dgx-a100", "DGX A100: 8x A100-SXM4-40GB, NVSwitch (NV12), 2 NUMA nodes",
               "a100-40", 8, "nvswitch", _HGX_BUSES, machine="DGXA100 920-23687-2530-000"),
        Preset("dgx-a100-80", "DGX A100 80GB: 8x A100-SXM4-80GB, NVSwitch (NV12), 2 NUMA nodes",
               "a100-80", 8, "nvswitch", _HGX_BUSES, machine="DGXA100 920-23687-2530-000"),
        Preset("dgx-h100", "DGX H100: 8x H100 80GB HBM3, NVSwitch (NV18), 2 NUMA nodes",
               "h100-80", 8, "nvswitch", _HGX_BUSES, machine="DGXH100"),
        Preset("hgx-h200", "HGX H200: 8x H200 141GB, NVSwitch (NV18), 2 NUMA nodes",
               "h200", 8, "nvswitch", _HGX_BUSES, machine="Simulated HGX H200"),
        Preset("pcie-l40s", "8x L40S on PCIe (no NVLink, no MIG), switch pairs, 2 NUMA nodes",
               "l40s", 8, "pcie", _PCIE_BUSES, machine="Simulated PCIe L40S server"),
        Preset("pcie-h100nvl", "4x H100 NVL 94GB on PCIe, NVLink-bridged pairs (NV12)",
               "h100-nvl", 4, "bridge-pairs", _PCIE_BUSES[:4],
               machine="Simulated PCIe H100 NVL server"),
        Preset("a30x4", "4x A30 24GB on PCIe (MIG with 4 slices), 1 NUMA node",
               "a30", 4, "pcie", _PCIE_BUSES[:4], machine="Simulated PCIe A30 server"),
        Preset("t4", "1x Tesla T4 16GB (no MIG, no NVLink)", "t4", 1, "pcie", _PCIE_BUSES[:1],
               machine="Simulated T4 server"),
        # DGX B200 datasheet: 8x B200, fifth-generation NVLink through 2 NVSwitch chips (NV18).
        Preset("dgx-b200", "DGX B200: 8x B200 180GB, NVSwitch (NV18), 2 NUMA nodes",
               "b200", 8, "nvswitch", _HGX_BUSES, switch_chips=2, machine="DGXB200"),
        # One Grace Hopper superchip per node: the GPU's NVLink-C2C goes to its CPU only.
        Preset("gh200", "1x GH200 480GB superchip (H100 96GB, MIG), no GPU peers", "gh200", 1,
               "pcie", _PCIE_BUSES[:1], machine="Simulated GH200 server"),
    )
}  # fmt: skip


def preset_names() -> list[str]:
    """Preset names in catalog order."""
    return list(PRESETS)


def describe_presets() -> list[tuple[str, str]]:
    """(name, one-line description) of every preset."""
    return [(p.name, p.description) for p in PRESETS.values()]


def get_preset(name: str) -> Preset:
    """The preset called ``name``. Raises KeyError listing the presets."""
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}") from None


def _digest(*parts: object) -> bytes:
    return hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()


def gpu_uuid(preset: str, index: int) -> str:
    """Stable ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`` UUID of a preset's GPU."""
    return f"GPU-{uuid.UUID(bytes=_digest('gpu', preset, index)[:16])}"


def mig_uuid(gpu_uuid_: str, serial: int) -> str:
    """UUID of a MIG device; new for every compute instance created, as on hardware."""
    return f"MIG-{uuid.UUID(bytes=_digest('mig', gpu_uuid_, serial)[:16])}"


def pair_level(preset: Preset, i: int, j: int) -> int:
    """NVML topology level of the PCIe path between GPUs i and j (``NVML_TOPOLOGY_*``).

    GPUs 2k and 2k+1 share a PCIe switch (SINGLE, "PIX"); GPUs on the same NUMA node meet at
    the host bridges of that node (NODE); others cross the SMP interconnect (SYSTEM).
    """
    if i == j:
        level = pynvml.NVML_TOPOLOGY_INTERNAL
    elif i // 2 == j // 2:
        level = pynvml.NVML_TOPOLOGY_SINGLE
    elif preset.numa_node(i) == preset.numa_node(j):
        level = pynvml.NVML_TOPOLOGY_NODE
    else:
        level = pynvml.NVML_TOPOLOGY_SYSTEM
    return int(level)


def nvlink_peers(preset: Preset, index: int, links: int) -> list[dict[str, Any]]:
    """The NVLink ports of one GPU: each port's remote end.

    On NVSwitch systems every port goes to a switch (remote ``{"switch": n}``); on bridged pairs
    every port goes to the peer GPU (``{"gpu": peer}``); PCIe-only nodes have no ports.
    """
    if preset.fabric == "nvswitch":
        # HGX boards spread each GPU's ports over the switch chips (6 on A100, 4 on H100).
        switches = preset.switch_chips or (6 if links == 12 else 4)
        return [{"switch": port % switches} for port in range(links)]
    if preset.fabric == "bridge-pairs":
        return [{"gpu": index ^ 1} for _ in range(links)]
    return []


def initial_gpus(preset: Preset) -> list[dict[str, Any]]:
    """The per-GPU part of a fresh state for ``preset``."""
    gpu_model = MODELS[preset.model]
    out: list[dict[str, Any]] = []
    for index in range(preset.gpus):
        serial = int.from_bytes(_digest("serial", preset.name, index)[:6], "big") % 10**13
        out.append(
            {
                "index": index,
                "model": gpu_model.key,
                "uuid": gpu_uuid(preset.name, index),
                "serial": f"{serial:013d}",
                "bus": preset.buses[index],
                "minor": index,
                "numa": preset.numa_node(index),
                "nvlinks": nvlink_peers(preset, index, gpu_model.nvlinks),
                "mig": {"current": 0, "pending": 0},
                "instances": [],
                # the same keys as ops.no_faults()
                "faults": {
                    "lost": False,
                    "thermal": False,
                    "nvlink_down": [],
                    "power": None,
                    "nvml_errors": {},
                },
                "ecc": {"sbe_vol": 0, "dbe_vol": 0, "sbe_agg": 0, "dbe_agg": 0},
                "remap": {"corr": 0, "unc": 0, "pending": 0, "failure": 0},
                "retired": {"sbe": [], "dbe": [], "pending": 0},
                "pcie_replay": 0,
                "nvlink_errors": 0,  # nvlink-down's +1, booked on link 0's replay counter
                "nvlink_counters": {},  # link -> {replay, recovery, crc_flit} from nvlink-errors
                # energy checkpoint: joules consumed up to "t" under the load then in force
                "energy": {"t": 0.0, "mj": 0},
            }
        )
    return out


# Every modelled GPU is a datacenter part in compute mode: a "3D controller" on the PCI bus.
PCI_CLASS = "0x030200"
HOST_DIR = "host"  # in the state directory: the simulated host's own files, as under /


def host_files(preset: Preset) -> dict[str, str]:
    """The host files GFD reads beside NVML, relative to the host root: the DMI product name
    and each GPU's PCI class (``sys/bus/pci/devices/<address>/class``)."""
    files = {"sys/class/dmi/id/product_name": preset.machine + "\n"}
    for bus in preset.buses[: preset.gpus]:
        files[f"sys/bus/pci/devices/0000:{bus:02x}:00.0/class"] = PCI_CLASS + "\n"
    return files


def bus_id(bus: int) -> str:
    """The NVML bus id string ("00000000:18:00.0") of a GPU on ``bus``."""
    return f"00000000:{bus:02X}:00.0"
