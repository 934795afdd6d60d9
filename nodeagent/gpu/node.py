"""All GPUs of the node behind one object, and the snapshot that samples them in one pass.

:class:`GpuNode` composes the concerns of the GPU layer, each in its own module: the NVML call
point (:mod:`nodeagent.gpu.nvml`), inventory and topology (:mod:`nodeagent.gpu.inventory`), MIG
(:mod:`nodeagent.gpu.mig`), telemetry (:mod:`nodeagent.gpu.telemetry`) and events
(:mod:`nodeagent.gpu.events`). Which NVML module it drives (the real ``pynvml`` or the
simulator) and how a GPU is reset are decided by the caller, once, at the edge of the program
(:mod:`nodeagent.agent.backend`); the GPU layer itself never looks at the environment.

Consumers that need only part of it take one of the protocols in
:mod:`nodeagent.gpu.protocols`.
"""

from __future__ import annotations

import logging
import time
from types import ModuleType
from typing import Any

from nodeagent.gpu.errors import GpuError, GpuLost
from nodeagent.gpu.events import EventWatcher
from nodeagent.gpu.inventory import Inventory, unknown_gpu_id
from nodeagent.gpu.mig import MigControl, MigModeChange, ResetFunction, nvidia_smi_reset
from nodeagent.gpu.nvml import Nvml
from nodeagent.gpu.profiling import ProfilingReader
from nodeagent.gpu.telemetry import Processes, TelemetryReader
from nodeagent.gpu.types import (
    GpuInfo,
    GpuInstance,
    GpuState,
    Link,
    MigGeometry,
    NodeSnapshot,
    Placement,
    Telemetry,
)

log = logging.getLogger(__name__)

__all__ = ["EventWatcher", "GpuNode", "MigModeChange", "unknown_gpu_id"]


class GpuNode:
    """All GPUs of this node, through one NVML module (real ``pynvml`` or the simulator).

    Args:
        module: the ``pynvml`` module, or an object with the same functions (the simulator).
        reset: how a GPU is reset for a pending MIG mode (``nvidia-smi -r`` by default).

    Raises the taxonomy error of ``nvmlInit`` (DriverNotLoaded without a driver).
    """

    def __init__(
        self, module: ModuleType | Any, *, reset: ResetFunction = nvidia_smi_reset
    ) -> None:
        self._nvml = Nvml(module)
        self._inventory = Inventory(self._nvml)
        processes = Processes(self._nvml)
        self._telemetry = TelemetryReader(self._nvml, self._inventory, processes)
        self._mig = MigControl(self._nvml, self._inventory, processes, reset)
        self._profiling = ProfilingReader(self._nvml)
        self._last_instances: dict[int, tuple[GpuInstance, ...]] = {}
        self._last_geometry: dict[int, MigGeometry | None] = {}

    def __enter__(self) -> GpuNode:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def nvml(self) -> Any:
        """The pynvml-compatible module in use."""
        return self._nvml.module

    def nvml_error_counts(self) -> dict[str, int]:
        """NVML errors by function since this node was opened (absent readings not counted)."""
        return dict(self._nvml.errors_total)

    # --- inventory and topology -------------------------------------------------------------
    def count(self) -> int:
        """Number of physical GPUs."""
        return self._nvml.count

    def info(self, index: int) -> GpuInfo:
        """Static facts of one GPU. Raises GpuLost when it stopped answering."""
        return self._inventory.info(index)

    def inventory(self) -> list[GpuInfo]:
        """Static facts of every GPU that answers (lost GPUs are left out; see snapshot())."""
        return self._inventory.inventory()

    def driver_version(self) -> str:
        """The kernel driver version, e.g. "570.124.06"."""
        return self._inventory.driver_version()

    def cuda_driver_version(self) -> str:
        """The CUDA version the driver supports, e.g. "12.8"."""
        return self._inventory.cuda_driver_version()

    def topology(self) -> dict[tuple[int, int], Link]:
        """The link between every ordered pair of GPUs (i, j), i != j, as ``nvidia-smi topo -m``."""
        return self._inventory.topology()

    # --- MIG ----------------------------------------------------------------------------------
    def mig_geometry(self, index: int) -> MigGeometry | None:
        """The GPU's MIG profiles and legal placements, or ``None`` when it is not MIG-capable."""
        return self._mig.mig_geometry(index)

    def mig_instances(self, index: int) -> tuple[GpuInstance, ...]:
        """Current GPU instances with compute instances and processes, sorted by placement."""
        return self._mig.mig_instances(index)

    def set_mig_mode(self, index: int, enabled: bool) -> MigModeChange:
        """Request MIG on or off. A change that needs a reset is reported, not an error."""
        return self._mig.set_mig_mode(index, enabled)

    def reset_gpu(self, index: int) -> None:
        """Reset the GPU so a pending MIG mode takes effect. Raises InUse while processes run."""
        self._mig.reset_gpu(index)

    def create_gpu_instance(self, index: int, profile: str, placement: Placement) -> GpuInstance:
        """Create a GPU instance at an explicit placement plus one compute instance spanning it."""
        return self._mig.create_gpu_instance(index, profile, placement)

    def destroy_gpu_instance(self, index: int, instance_id: int) -> None:
        """Destroy a GPU instance's compute instances, then the instance. Raises InUse when busy."""
        self._mig.destroy_gpu_instance(index, instance_id)

    def destroy_compute_instance(self, index: int, gpu_instance_id: int, ci_id: int) -> None:
        """Destroy one compute instance. Raises InUse while processes run on it."""
        self._mig.destroy_compute_instance(index, gpu_instance_id, ci_id)

    # --- telemetry, snapshots and events ------------------------------------------------------
    @property
    def nvlink_counters_interval_s(self) -> float:
        """NVLink error counters are read at most this often (0: on every sample)."""
        return self._telemetry.nvlink_counters_interval_s

    @nvlink_counters_interval_s.setter
    def nvlink_counters_interval_s(self, value: float) -> None:
        self._telemetry.nvlink_counters_interval_s = value

    @property
    def profiling_enabled(self) -> bool:
        """Whether snapshots carry GPM profiling figures (where the GPU has GPM; on by default)."""
        return self._profiling.enabled

    @profiling_enabled.setter
    def profiling_enabled(self, value: bool) -> None:
        self._profiling.enabled = value

    @property
    def profiling_interval_s(self) -> float:
        """GPM figures are sampled at most this often (0: on every sample), over that span."""
        return self._profiling.interval_s

    @profiling_interval_s.setter
    def profiling_interval_s(self, value: float) -> None:
        self._profiling.interval_s = value

    def telemetry(self, index: int) -> Telemetry:
        """One sample of moving values and health counters."""
        return self._telemetry(index)

    def _gpu_state(self, index: int, driver: str, cuda: str) -> GpuState:
        try:
            info = self._inventory.read_info(index, driver, cuda)
            processes = self._mig.processes(index)
            with self._nvml.soft_errors() as failed_readings:
                telemetry = self._telemetry(index, processes)
            instances = self._mig.sample_instances(index, processes, bool(info.mig_enabled))
            # Read by sample_instances already when MIG is on (and cached), so this is free.
            geometry = self._mig.mig_geometry(index) if info.mig_enabled else None
            # GPM after the coarse readings: two samples bound each interval (this pass's and
            # the last one's), per GPU and per GPU instance.
            profiling, instances = self._profiling.read(index, instances)
            self._last_instances[index] = instances
            self._last_geometry[index] = geometry
            return GpuState(
                info=info,
                telemetry=telemetry,
                mig_instances=instances,
                # The readings that failed are None in the telemetry; the error says which.
                error="; ".join(failed_readings) if failed_readings else None,
                mig_geometry=geometry,
                profiling=profiling,
            )
        except GpuLost as exc:
            info = self._inventory.unreadable_info(index, driver, cuda)
            # Its last known MIG layout stays, so the devices on it are reported lost (health,
            # device plugin, metrics) rather than silently vanishing.
            return GpuState(
                info=info,
                telemetry=None,
                mig_instances=self._last_instances.get(index, ()),
                lost=True,
                error=str(exc),
                mig_geometry=self._last_geometry.get(index),
            )
        except GpuError as exc:
            # Any other failure spoils this GPU's sample only; the pass goes on for the others.
            log.warning("GPU %d could not be sampled: %s", index, exc)
            info = self._inventory.unreadable_info(index, driver, cuda)
            return GpuState(info=info, telemetry=None, mig_instances=(), error=str(exc))

    def snapshot(self) -> NodeSnapshot:
        """Sample every GPU; a lost GPU is marked lost while the others are read normally."""
        started = time.perf_counter()
        timestamp = time.time()
        with self._nvml.error_pass() as pass_errors:
            driver = self._inventory.driver_version()
            cuda = self._inventory.cuda_driver_version()
            gpus = tuple(self._gpu_state(i, driver, cuda) for i in range(self._nvml.count))
            topology = self._inventory.topology()
        self._telemetry.usage.forget_gone(
            {p.pid for g in gpus if g.telemetry is not None for p in g.telemetry.processes}
        )
        return NodeSnapshot(
            timestamp_s=timestamp,
            sample_duration_s=time.perf_counter() - started,
            driver_version=driver,
            cuda_driver_version=cuda,
            gpus=gpus,
            topology=topology,
            nvml_errors=dict(pass_errors),
        )

    def watch_events(self) -> EventWatcher:
        """Open an event set for XID and ECC events on all GPUs."""
        return EventWatcher(self._nvml)

    def close(self) -> None:
        """Free the GPM samples and shut NVML down."""
        self._profiling.close()
        self._nvml.close()
