"""Inventory: what the GPUs are and how they are connected (facts that rarely change)."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, fields
from typing import Any

from nodeagent.gpu import errors
from nodeagent.gpu._topology import link_kind_for_level, normalize_bus_id
from nodeagent.gpu.errors import GpuLost
from nodeagent.gpu.nvml import NO_SUCH_ITEM, Nvml, text
from nodeagent.gpu.types import GpuInfo, Link, LinkKind

log = logging.getLogger(__name__)

# Number of NVLink indices probed when the module does not define NVML_NVLINK_MAX_LINKS.
_DEFAULT_MAX_NVLINKS = 18


@dataclass(frozen=True, slots=True)
class Static:
    """Facts of one GPU that never change while NVML is initialised (read once, cached)."""

    uuid: str
    name: str
    serial: str | None
    pci_bus_id: str
    pci_device_id: int
    numa_node: int | None
    memory_total_bytes: int
    compute_capability: tuple[int, int]
    vbios_version: str | None
    minor_number: int | None
    temperature_slowdown_celsius: float | None
    nvlinks: tuple[int, ...]  # indices of the NVLinks this GPU has (up or down)


# The static facts GpuInfo carries as they are (the rest serve the inventory's own reads).
_STATIC_INFO = tuple(
    fact.name for fact in fields(Static) if fact.name in {info.name for info in fields(GpuInfo)}
)


def unknown_gpu_id(index: int) -> str:
    """The identifier of a GPU whose UUID could not be read (it was lost before)."""
    return f"GPU-unknown-index-{index}"


def _cuda_version(raw: int) -> str:
    """NVML's CUDA driver version integer as ``major.minor`` (12080 -> "12.8")."""
    return f"{raw // 1000}.{(raw % 1000) // 10}"


class Inventory:
    """Static facts, MIG mode, driver versions and the topology of every GPU."""

    def __init__(self, nvml: Nvml) -> None:
        self._nvml = nvml
        self._static: dict[int, Static] = {}
        self._last_info: dict[int, GpuInfo] = {}
        self._topology: dict[tuple[int, int], Link] | None = None

    def static(self, index: int) -> Static:
        """The GPU's fixed facts, read on first use."""
        cached = self._static.get(index)
        if cached is not None:
            return cached
        nvml = self._nvml
        h = nvml.handle(index)
        pci = nvml.call("nvmlDeviceGetPciInfo", h, gpu=index)
        numa = nvml.optional("nvmlDeviceGetNumaNodeId", h, gpu=index)
        minor = nvml.optional("nvmlDeviceGetMinorNumber", h, gpu=index)
        serial = nvml.optional("nvmlDeviceGetSerial", h, gpu=index)
        vbios = nvml.optional("nvmlDeviceGetVbiosVersion", h, gpu=index)
        slowdown = nvml.optional(
            "nvmlDeviceGetTemperatureThreshold",
            h,
            nvml.const("NVML_TEMPERATURE_THRESHOLD_SLOWDOWN", 1),
            gpu=index,
        )
        major, minor_cc = nvml.call("nvmlDeviceGetCudaComputeCapability", h, gpu=index)
        static = Static(
            uuid=text(nvml.call("nvmlDeviceGetUUID", h, gpu=index)),
            name=text(nvml.call("nvmlDeviceGetName", h, gpu=index)),
            serial=text(serial) if serial is not None else None,
            pci_bus_id=normalize_bus_id(text(pci.busId)),
            pci_device_id=int(pci.pciDeviceId),
            # NVML reports -1 where the platform has no NUMA affinity for the GPU.
            numa_node=int(numa) if numa is not None and int(numa) >= 0 else None,
            memory_total_bytes=int(nvml.call("nvmlDeviceGetMemoryInfo", h, gpu=index).total),
            compute_capability=(int(major), int(minor_cc)),
            vbios_version=text(vbios) if vbios is not None else None,
            minor_number=int(minor) if minor is not None else None,
            temperature_slowdown_celsius=float(slowdown) if slowdown is not None else None,
            nvlinks=self._discover_nvlinks(index, h),
        )
        self._static[index] = static
        return static

    def _discover_nvlinks(self, index: int, handle: Any) -> tuple[int, ...]:
        """The NVLink indices that exist on this GPU (a link that is down still exists)."""
        nvml = self._nvml
        links: list[int] = []
        for link in range(nvml.const("NVML_NVLINK_MAX_LINKS", _DEFAULT_MAX_NVLINKS)):
            # INVALID_ARGUMENT: beyond this GPU's link count; NOT_SUPPORTED: no NVLink at all.
            _, code = nvml.attempt(
                "nvmlDeviceGetNvLinkState", handle, link, gpu=index, expected=NO_SUCH_ITEM
            )
            if code == errors.NVML_SUCCESS:
                links.append(link)
        return tuple(links)

    def mig_mode(self, index: int) -> tuple[bool, bool, bool]:
        """(capable, current, pending) MIG mode; NOT_SUPPORTED means the GPU is not MIG-capable."""
        nvml = self._nvml
        mode = nvml.optional("nvmlDeviceGetMigMode", nvml.handle(index), gpu=index)
        if mode is None:
            return False, False, False
        current, pending = mode
        return True, bool(current), bool(pending)

    def read_info(self, index: int, driver: str, cuda: str) -> GpuInfo:
        """Static facts plus the MIG mode now; remembered for when the GPU stops answering."""
        static = self.static(index)
        capable, current, pending = self.mig_mode(index)
        info = GpuInfo(
            index=index,
            driver_version=driver,
            cuda_driver_version=cuda,
            mig_capable=capable,
            mig_enabled=current,
            mig_pending=pending,
            **{name: getattr(static, name) for name in _STATIC_INFO},
        )
        self._last_info[index] = info
        return info

    def info(self, index: int) -> GpuInfo:
        """Static facts of one GPU. Raises GpuLost when it stopped answering."""
        return self.read_info(index, self.driver_version(), self.cuda_driver_version())

    def inventory(self) -> list[GpuInfo]:
        """Static facts of every GPU that answers (lost GPUs are left out; see snapshot())."""
        driver, cuda = self.driver_version(), self.cuda_driver_version()
        found: list[GpuInfo] = []
        for index in range(self._nvml.count):
            try:
                found.append(self.read_info(index, driver, cuda))
            except GpuLost as exc:
                log.warning("GPU %d left out of the inventory: %s", index, exc)
        return found

    def unreadable_info(self, index: int, driver: str, cuda: str) -> GpuInfo:
        """The last known facts of a GPU that no longer answers, or a minimal stand-in."""
        last = self._last_info.get(index)
        if last is not None:
            return last
        static = self._static.get(index)
        return GpuInfo(
            index=index,
            # A GPU lost before this process ever read it cannot say who it is; a stable
            # stand-in keyed by index keeps it visible (health, metrics) instead of dropped.
            uuid=static.uuid if static else unknown_gpu_id(index),
            name=static.name if static else "unknown",
            serial=static.serial if static else None,
            pci_bus_id=static.pci_bus_id if static else "",
            pci_device_id=static.pci_device_id if static else 0,
            numa_node=static.numa_node if static else None,
            memory_total_bytes=static.memory_total_bytes if static else 0,
            compute_capability=static.compute_capability if static else (0, 0),
            driver_version=driver,
            cuda_driver_version=cuda,
            vbios_version=static.vbios_version if static else None,
            mig_capable=False,
            mig_enabled=False,
            mig_pending=False,
        )

    def driver_version(self) -> str:
        """The kernel driver version, e.g. "570.124.06"."""
        return text(self._nvml.call("nvmlSystemGetDriverVersion"))

    def cuda_driver_version(self) -> str:
        """The CUDA version the driver supports, e.g. "12.8"."""
        return _cuda_version(int(self._nvml.call("nvmlSystemGetCudaDriverVersion")))

    # --- topology -----------------------------------------------------------------------------
    def topology(self) -> dict[tuple[int, int], Link]:
        """The link between every ordered pair of GPUs (i, j), i != j, as ``nvidia-smi topo -m``.

        Computed once (it does not change while the driver is loaded) and reused by snapshot().
        A GPU that is lost while it is computed is left out, and the result is not cached.
        """
        if self._topology is not None:
            return dict(self._topology)
        topology, complete = self._compute_topology()
        if complete:
            self._topology = topology
        return dict(topology)

    def _compute_topology(self) -> tuple[dict[tuple[int, int], Link], bool]:
        nvml = self._nvml
        complete = True
        answering: list[int] = []
        for index in range(nvml.count):
            try:
                self.static(index)
                answering.append(index)
            except GpuLost:
                complete = False
        by_bus = {self._static[i].pci_bus_id: i for i in answering}
        direct: Counter[tuple[int, int]] = Counter()  # NVLinks from i that land on GPU j
        to_switch: Counter[int] = Counter()  # active NVLinks from i that land on an NVSwitch
        switch_type = nvml.const("NVML_NVLINK_DEVICE_TYPE_SWITCH", 2)
        for i in list(answering):
            try:
                self._count_nvlinks(i, by_bus, switch_type, direct, to_switch)
            except GpuLost:
                answering.remove(i)
                complete = False
        p2p_nvlink = nvml.const("NVML_P2P_CAPS_INDEX_NVLINK", 2)
        p2p_ok = nvml.const("NVML_P2P_STATUS_OK", 0)
        topology: dict[tuple[int, int], Link] = {}
        for i in answering:
            for j in answering:
                if i >= j:
                    continue
                try:
                    link = self._pair_link(i, j, direct, to_switch, p2p_nvlink, p2p_ok)
                except GpuLost:
                    complete = False
                    continue
                topology[(i, j)] = topology[(j, i)] = link
        return topology, complete

    def _count_nvlinks(
        self,
        i: int,
        by_bus: dict[str, int],
        switch_type: int,
        direct: Counter[tuple[int, int]],
        to_switch: Counter[int],
    ) -> None:
        nvml = self._nvml
        h = nvml.handle(i)
        for link in self._static[i].nvlinks:
            if not nvml.optional("nvmlDeviceGetNvLinkState", h, link, gpu=i):
                continue
            remote = nvml.optional("nvmlDeviceGetNvLinkRemotePciInfo", h, link, gpu=i)
            remote_bus = normalize_bus_id(text(remote.busId)) if remote is not None else None
            j = by_bus.get(remote_bus) if remote_bus is not None else None
            if j is not None and j != i:
                direct[(i, j)] += 1
                continue
            kind = nvml.optional("nvmlDeviceGetNvLinkRemoteDeviceType", h, link, gpu=i)
            # Older drivers cannot name the remote type; a link that reaches no GPU of this node
            # then goes to an NVSwitch (the only other NVLink peer in a GPU server).
            if kind == switch_type or (kind is None and j is None):
                to_switch[i] += 1

    def _pair_link(
        self,
        i: int,
        j: int,
        direct: Counter[tuple[int, int]],
        to_switch: Counter[int],
        p2p_nvlink: int,
        p2p_ok: int,
    ) -> Link:
        nvml = self._nvml
        count = max(direct[(i, j)], direct[(j, i)])
        if count:
            return Link(LinkKind.NVLINK, count)
        hi, hj = nvml.handle(i), nvml.handle(j)
        if to_switch[i] and to_switch[j]:
            # Behind NVSwitches every GPU reaches every other through all its links; NVML's P2P
            # status says whether the pair can actually talk over NVLink.
            status = nvml.optional("nvmlDeviceGetP2PStatus", hi, hj, p2p_nvlink, gpu=i)
            if status == p2p_ok:
                return Link(LinkKind.NVLINK, min(to_switch[i], to_switch[j]))
        level = nvml.call("nvmlDeviceGetTopologyCommonAncestor", hi, hj, gpu=i)
        return Link(link_kind_for_level(int(level)))
