"""The typed GPU API: the only code in nodeagent that calls NVML.

CONTRACT FILE: the signatures below are what every feature package builds on. The bodies are
filled in by the GPU-layer work; keep the signatures stable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from nodeagent.gpu.types import (
    GpuEvent,
    GpuInfo,
    GpuInstance,
    Link,
    MigGeometry,
    NodeSnapshot,
    Placement,
    Telemetry,
)


@dataclass(frozen=True, slots=True)
class MigModeChange:
    """Result of a MIG mode change request."""

    gpu_index: int
    current: bool
    pending: bool
    reset_required: bool  # the mode takes effect only after a GPU reset
    reason: str | None  # why the change is not active yet (processes running, say)


class EventWatcher:
    """An NVML event set registered for XID and ECC events on every GPU that supports them."""

    def wait(self, timeout_s: float) -> GpuEvent | None:
        """Block until an event arrives or the timeout passes (then ``None``)."""
        raise NotImplementedError

    def close(self) -> None:
        """Free the event set."""
        raise NotImplementedError


class GpuNode:
    """All GPUs of this node, through one NVML module (real ``pynvml`` or the simulator)."""

    nvml: Any  # the pynvml-compatible module in use
    simulated: bool

    def __init__(self, nvml: ModuleType | Any, *, simulated: bool) -> None:
        raise NotImplementedError

    # --- inventory and topology -------------------------------------------------------------
    def count(self) -> int:
        """Number of physical GPUs."""
        raise NotImplementedError

    def info(self, index: int) -> GpuInfo:
        """Static facts of one GPU. Raises GpuLost when it stopped answering."""
        raise NotImplementedError

    def inventory(self) -> list[GpuInfo]:
        """Static facts of every GPU that answers (lost GPUs are left out; see snapshot())."""
        raise NotImplementedError

    def driver_version(self) -> str:
        """The kernel driver version, e.g. "570.124.06"."""
        raise NotImplementedError

    def cuda_driver_version(self) -> str:
        """The CUDA version the driver supports, e.g. "12.8"."""
        raise NotImplementedError

    def topology(self) -> dict[tuple[int, int], Link]:
        """The link between every ordered pair of GPUs (i, j), i != j, as ``nvidia-smi topo -m``."""
        raise NotImplementedError

    # --- MIG ----------------------------------------------------------------------------------
    def mig_geometry(self, index: int) -> MigGeometry | None:
        """The GPU's MIG profiles and legal placements, or ``None`` when it is not MIG-capable."""
        raise NotImplementedError

    def mig_instances(self, index: int) -> tuple[GpuInstance, ...]:
        """Current GPU instances with compute instances and processes, sorted by placement."""
        raise NotImplementedError

    def set_mig_mode(self, index: int, enabled: bool) -> MigModeChange:
        """Request MIG on or off. A change that needs a reset is reported, not an error."""
        raise NotImplementedError

    def reset_gpu(self, index: int) -> None:
        """Reset the GPU so a pending MIG mode takes effect. Raises InUse while processes run."""
        raise NotImplementedError

    def create_gpu_instance(self, index: int, profile: str, placement: Placement) -> GpuInstance:
        """Create a GPU instance at an explicit placement plus one compute instance spanning it.

        Raises InsufficientResources on overlap or exhausted capacity, NotSupported when MIG is
        off, InvalidArgument for a placement the profile does not allow.
        """
        raise NotImplementedError

    def destroy_gpu_instance(self, index: int, instance_id: int) -> None:
        """Destroy a GPU instance's compute instances, then the instance. Raises InUse when busy."""
        raise NotImplementedError

    def destroy_compute_instance(self, index: int, gpu_instance_id: int, ci_id: int) -> None:
        """Destroy one compute instance. Raises InUse while processes run on it."""
        raise NotImplementedError

    # --- telemetry, health and events --------------------------------------------------------
    def telemetry(self, index: int) -> Telemetry:
        """One sample of moving values and health counters."""
        raise NotImplementedError

    def snapshot(self) -> NodeSnapshot:
        """Sample every GPU; a lost GPU is marked lost while the others are read normally."""
        raise NotImplementedError

    def watch_events(self) -> EventWatcher:
        """Open an event set for XID and ECC events on all GPUs."""
        raise NotImplementedError

    def close(self) -> None:
        """Shut NVML down."""
        raise NotImplementedError


def open_node(simulate: str | None = None, state_dir: Path | None = None) -> GpuNode:
    """Open the node's GPUs: the simulator when ``simulate`` names a preset, else real NVML.

    ``simulate`` falls back to env ``NODEAGENT_SIMULATE``. The simulator's state lives in
    ``state_dir`` (falls back to env ``NODEAGENT_SIM_STATE``, then the user's state directory);
    it is created from the preset when empty. Raises DriverNotLoaded without a driver.
    """
    raise NotImplementedError


def preset_names() -> Sequence[str]:
    """The simulator presets, for error hints and ``nodeagent sim presets``."""
    raise NotImplementedError
