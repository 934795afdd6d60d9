"""The capability labels this node publishes, from the latest snapshot and the agent's state."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from nodeagent import labels
from nodeagent.config.schema import AgentConfig
from nodeagent.gpu.types import NodeSnapshot
from nodeagent.runtime.snapshots import SnapshotFeed
from nodeagent_device_plugin.resources import SharingResolver

log = logging.getLogger(__name__)

# Where GFD reads the machine type and each GPU's PCI class, relative to the host root.
MACHINE_TYPE_FILE = Path("sys/class/dmi/id/product_name")
PCI_DEVICES_DIR = Path("sys/bus/pci/devices")


class LayoutSource(Protocol):
    """Which MIG layout the node holds in full (the MIG reconciler)."""

    @property
    def applied_layout(self) -> str | None:
        """The layout name last applied in full, or None."""
        ...


def sysfs_pci_address(bus_id: str) -> str:
    """NVML's bus id as sysfs names the device: ``00000000:18:00.0`` -> ``0000:18:00.0``."""
    domain, _, rest = bus_id.partition(":")
    return f"{domain[-4:]}:{rest}".lower() if rest else bus_id.lower()


@dataclass(frozen=True, slots=True)
class HostFacts:
    """What GFD reads from the host beside NVML: the machine type and the GPUs' PCI classes."""

    machine: str | None  # None: the file could not be read (GFD labels "unknown")
    pci_classes: Mapping[int, str] = field(default_factory=dict)


def read_host_facts(root: Path, snapshot: NodeSnapshot) -> HostFacts:
    """The machine type and PCI classes under ``root`` (``/`` on a node; a simulated node's
    host tree in simulation). A file that cannot be read is left out: its label says unknown."""
    try:
        machine: str | None = (root / MACHINE_TYPE_FILE).read_text(errors="replace").strip()
    except OSError as exc:
        log.debug("machine type: %s", exc)
        machine = None
    classes: dict[int, str] = {}
    for gpu in snapshot.gpus:
        path = root / PCI_DEVICES_DIR / sysfs_pci_address(gpu.info.pci_bus_id) / "class"
        try:
            classes[gpu.info.index] = path.read_text().strip().lower()
        except OSError as exc:
            log.debug("PCI class of GPU %d: %s", gpu.info.index, exc)
    return HostFacts(machine, classes)


class CapabilityLabels:
    """The node's capability labels (GFD's set plus ``nodeagent.io/``), computed when asked.

    Health labels are left out: the health reporter owns ``gpu-health``, ``stability`` and the
    driver version. The MIG layout label appears once the reconciler applied the pool's layout
    (``mig`` says which; without a reconciler there is no such label). Sharing is the device
    plugin's, GPU by GPU, so ``gpu.replicas`` and ``gpu.sharing-strategy`` say what is served.
    The machine type and PCI classes are read under ``host_root`` once per snapshot's GPU set:
    they do not change while the node runs.
    """

    def __init__(
        self,
        snapshots: SnapshotFeed,
        config: AgentConfig,
        mig: LayoutSource | None = None,
        *,
        host_root: Path = Path("/"),
    ) -> None:
        self._snapshots = snapshots
        self._config = config
        self._mig = mig
        self._host_root = host_root
        self._host: tuple[tuple[str, ...], HostFacts] | None = None

    def reload(self, config: AgentConfig) -> None:
        """Take the new pool, MIG strategy and sharing (SIGHUP)."""
        self._config = config

    def _host_facts(self, snapshot: NodeSnapshot) -> HostFacts:
        key = tuple(g.info.pci_bus_id for g in snapshot.gpus)
        if self._host is None or self._host[0] != key:
            self._host = (key, read_host_facts(self._host_root, snapshot))
        return self._host[1]

    def __call__(self) -> Mapping[str, str]:
        """The labels now; empty before the first snapshot."""
        snapshot = self._snapshots.latest
        if snapshot is None:
            return {}
        config = self._config
        host = self._host_facts(snapshot)
        resolver = SharingResolver(config.pool, config.device_plugin)
        facts = labels.NodeFacts(
            pool=config.node.pool,
            mig_strategy=str(config.device_plugin.mig_strategy),
            machine=host.machine,
            pci_classes=host.pci_classes,
            sharing=resolver.sharing_for,
        )
        result = labels.capability_labels(snapshot, facts)
        layout = self._mig.applied_layout if self._mig is not None else None
        if layout is not None:
            result[labels.MIG_LAYOUT] = labels.label_value(layout)
        return result
