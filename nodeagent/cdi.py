"""CDI (Container Device Interface) specs for NVIDIA GPUs and MIG devices.

One transient spec file per claim (``<vendor>-<class>_<id>.json`` in the spec directory, the
CDI naming of transient specs), written atomically; devices are named ``<id>-<device>`` and
the container runtime injects them by their qualified ID ``<vendor>/<class>=<name>``. Each
device carries what a container needs: the GPU's device node with the control nodes, for a MIG
device its capability nodes when the driver exposes them, ``NVIDIA_VISIBLE_DEVICES`` with the
UUIDs, and for MPS the pipe directory mount and the client limits.

Shared by the DRA driver (per claim) and usable by the device plugin's ``cdi`` strategy.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodeagent.atomicfile import write_json_atomic

CDI_VERSION = "0.6.0"  # env, deviceNodes, mounts and annotations; no field of a later version
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
_NAME_OK = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True, slots=True)
class Mps:
    """MPS client settings for a device shared through an MPS control daemon."""

    pipe_dir: Path
    log_dir: Path
    active_thread_percentage: int | None = None
    pinned_memory_limit_mib: int | None = None


@dataclass(frozen=True, slots=True)
class CdiDevice:
    """One device to inject: what it is named after and what it exposes."""

    name: str  # the device's name in the pool, e.g. gpu-0-mig-3g40gb-9-4
    uuids: tuple[str, ...]  # GPU-... or MIG-... UUIDs for NVIDIA_VISIBLE_DEVICES
    gpu_minors: tuple[int, ...]  # /dev/nvidia<minor> of the GPUs behind it
    cap_minors: tuple[int, ...] = ()  # /dev/nvidia-caps/nvidia-cap<N> (MIG GI and CI access)
    mps: Mps | None = None
    env: tuple[str, ...] = ()  # further K=V pairs (time-slicing hints, say)


def mig_cap_minors(proc_root: Path, gpu_minor: int, gi: int, ci: int) -> tuple[int, ...]:
    """The capability device minors of a MIG device, from the driver's ``access`` files
    (``/proc/driver/nvidia/capabilities/gpu<m>/mig/gi<G>[/ci<C>]/access``, "DeviceFileMinor: N");
    empty where the driver does not expose them (no such files)."""
    base = proc_root / f"gpu{gpu_minor}" / "mig" / f"gi{gi}"
    out = []
    for path in (base / "access", base / f"ci{ci}" / "access"):
        try:
            text = path.read_text(encoding="ascii", errors="replace")
        except OSError:
            continue
        match = re.search(r"DeviceFileMinor:\s*(\d+)", text)
        if match:
            out.append(int(match.group(1)))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class CdiWriter:
    """Writes and removes the transient specs of one vendor/class in ``spec_dir``."""

    spec_dir: Path
    vendor: str  # e.g. k8s.gpu.nodeagent.io
    device_class: str = "claim"

    @property
    def kind(self) -> str:
        """``<vendor>/<class>``."""
        return f"{self.vendor}/{self.device_class}"

    def spec_path(self, spec_id: str) -> Path:
        """The transient spec file of ``spec_id`` ('/' in the id becomes '_')."""
        return self.spec_dir / f"{self.vendor}-{self.device_class}_{spec_id.replace('/', '_')}.json"

    def device_name(self, spec_id: str, device: str) -> str:
        """``<id>-<device>``, in the characters CDI allows."""
        return _NAME_OK.sub("_", f"{spec_id}-{device}")

    def qualified(self, spec_id: str, device: str) -> str:
        """The CDI device ID the runtime takes: ``<vendor>/<class>=<id>-<device>``."""
        return f"{self.kind}={self.device_name(spec_id, device)}"

    def spec(self, spec_id: str, devices: Sequence[CdiDevice]) -> dict[str, Any]:
        """The spec document of ``devices``."""
        return {
            "cdiVersion": CDI_VERSION,
            "kind": self.kind,
            "devices": [
                {"name": self.device_name(spec_id, d.name), "containerEdits": _edits(d)}
                for d in devices
            ],
            "containerEdits": {"deviceNodes": [{"path": p} for p in CONTROL_NODES]},
        }

    def write(self, spec_id: str, devices: Sequence[CdiDevice]) -> list[str]:
        """Write the spec of ``devices`` atomically; return their qualified CDI device IDs."""
        write_json_atomic(self.spec_path(spec_id), self.spec(spec_id, devices))
        return [self.qualified(spec_id, d.name) for d in devices]

    def remove(self, spec_id: str) -> None:
        """Remove the spec of ``spec_id`` (nothing when it is gone already)."""
        self.spec_path(spec_id).unlink(missing_ok=True)


def _edits(d: CdiDevice) -> dict[str, Any]:
    env = [f"NVIDIA_VISIBLE_DEVICES={','.join(d.uuids)}", *d.env]
    nodes = [{"path": f"/dev/nvidia{m}"} for m in d.gpu_minors]
    nodes += [{"path": f"/dev/nvidia-caps/nvidia-cap{m}"} for m in d.cap_minors]
    edits: dict[str, Any] = {"env": env, "deviceNodes": nodes}
    if d.mps is not None:
        env += [
            f"CUDA_MPS_PIPE_DIRECTORY={d.mps.pipe_dir}",
            f"CUDA_MPS_LOG_DIRECTORY={d.mps.log_dir}",
        ]
        if d.mps.active_thread_percentage is not None:
            env.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={d.mps.active_thread_percentage}")
        if d.mps.pinned_memory_limit_mib is not None:
            limit = f"{d.mps.pinned_memory_limit_mib}M"
            env.append(
                f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={','.join(f'{u}={limit}' for u in d.uuids)}"
            )
        edits["mounts"] = [
            {
                "hostPath": str(d.mps.pipe_dir),
                "containerPath": str(d.mps.pipe_dir),
                "options": ["rbind", "rw"],
            }
        ]
    return edits
