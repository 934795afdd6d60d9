"""What workloads hold on this node: the GPUs and MIG instances that are theirs.

A workload holds an instance (or a whole GPU) through

* a DRA claim the agent's DRA plugin prepared (its checkpoint,
  :mod:`nodeagent.holds.dra_checkpoint`), by the device names it answered; or
* a device-plugin allocation: the kubelet's pod-resources API, or its checkpoint where the API
  does not answer (:mod:`nodeagent.kubelet.allocations`), by device ID (a GPU or MIG UUID).

Such an instance is *busy* exactly as one with running processes is: ``mig apply``, the MIG
reconciler and the DRA plugin's clean-up never destroy it without ``--force`` (``mig.force``),
and every refusal names the claim or pod. Features read holds through here, so none of them
imports another's internals.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from nodeagent.gpu.types import GpuInstance
from nodeagent.holds.dra_checkpoint import ClaimRecord, checkpoint_path, mark_failed, read_claims
from nodeagent.kubelet.allocations import (
    AllocationsUnavailableError,
    DeviceAllocation,
    device_allocations,
)

log = logging.getLogger(__name__)

CLAIM = "claim"
POD = "pod"

# The DRA device names (nodeagent_dra.slices): a whole GPU, and a MIG device as
# ``gpu-<index>-mig-<profile token>-<GI profile ID>-<start slice>``. GPU, profile ID and start
# name one instance; tests/mig/test_holds.py checks these against the names the slices publish.
_GPU = re.compile(r"^gpu-(\d+)$")
_MIG = re.compile(r"^gpu-(\d+)-mig-[a-z0-9-]+-(\d+)-(\d+)$")


@dataclass(frozen=True, slots=True)
class Holder:
    """A workload that holds a device: a DRA claim or a pod's container."""

    kind: str  # CLAIM or POD
    name: str  # namespace/name, or "uid <uid>" for a pod known only from the kubelet checkpoint
    uid: str = ""  # the claim's UID (to mark it failed); the pod's where known
    container: str = ""

    @property
    def label(self) -> str:
        """``DRA claim team-a/train``, ``pod team-a/infer-0 (container main)``."""
        if self.kind == CLAIM:
            return f"DRA claim {self.name}"
        return f"pod {self.name}" + (f" (container {self.container})" if self.container else "")


def describe(holders: Sequence[Holder]) -> str:
    """``held by DRA claim a/b, pod c/d (container e)`` (empty for no holder)."""
    return "held by " + ", ".join(h.label for h in holders) if holders else ""


@dataclass(frozen=True, slots=True)
class _ClaimDevice:
    gpu: int
    holder: Holder
    profile: str | None = None  # from the intent the plugin wrote, when it made the instance
    profile_id: int | None = None  # from the device name
    start: int | None = None  # None: the whole GPU


@dataclass(frozen=True)
class Holds:
    """Who holds what, read once; :data:`NO_HOLDS` where nothing is known to hold anything.

    ``unknown`` is set when a source exists but could not be read: then nothing can be shown
    free, and callers refuse to destroy anything without force (saying why).
    """

    claims: tuple[_ClaimDevice, ...] = ()
    allocations: tuple[DeviceAllocation, ...] = ()
    unknown: str | None = None
    dra_checkpoint: Path | None = None
    sources: tuple[str, ...] = ()  # where the facts came from, for the log

    def of_instance(self, gi: GpuInstance, *, besides: str = "") -> tuple[Holder, ...]:
        """Who holds the MIG instance ``gi`` (claims other than UID ``besides``)."""
        out: list[Holder] = []
        for c in self.claims:
            if c.gpu != gi.gpu_index or c.holder.uid == besides:
                continue
            if c.start is None or (
                c.start == gi.placement.start
                and (c.profile is None or c.profile == gi.profile)
                and (c.profile_id is None or c.profile_id == gi.profile_id)
            ):
                out.append(c.holder)
        uuids = {ci.uuid for ci in gi.compute_instances}
        out += [_pod(a) for a in self.allocations if a.device_id in uuids]
        return tuple(dict.fromkeys(out))

    def of_gpu(self, index: int, uuid: str, *, besides: str = "") -> tuple[Holder, ...]:
        """Who holds GPU ``index`` whole (a ``gpu-N`` claim, an ``nvidia.com/gpu`` pod)."""
        out = [
            c.holder
            for c in self.claims
            if c.gpu == index and c.start is None and c.holder.uid != besides
        ]
        out += [_pod(a) for a in self.allocations if a.device_id == uuid]
        return tuple(dict.fromkeys(out))

    def mark_failed(self, holders: Sequence[Holder], why: str) -> list[str]:
        """Mark each DRA claim of ``holders`` failed in the checkpoint; log each pod's loss.

        Returns one line per holder saying what was done (for the report). Never raises: the
        instance is gone already, and a checkpoint that cannot be written is reported.
        """
        lines = []
        for h in dict.fromkeys(holders):
            if h.kind == CLAIM and self.dra_checkpoint is not None:
                try:
                    marked = mark_failed(self.dra_checkpoint, h.uid, why)
                except (OSError, ValueError) as exc:
                    log.error("could not mark %s failed: %s", h.label, exc)
                    lines.append(f"{h.label}: could not be marked failed ({exc})")
                    continue
                lines.append(f"{h.label} marked failed" if marked else f"{h.label} is gone")
            else:
                log.warning("%s lost its device: %s", h.label, why)
                lines.append(f"{h.label} lost its device")
        return lines


NO_HOLDS = Holds()


def _pod(a: DeviceAllocation) -> Holder:
    return Holder(POD, a.pod_label, a.pod_uid, a.container)


def _claim_devices(record: ClaimRecord) -> list[_ClaimDevice]:
    holder = Holder(CLAIM, f"{record.namespace}/{record.name}", record.uid)
    out = []
    for d in record.devices:
        if d.mig is not None:
            out.append(_ClaimDevice(d.mig.gpu_index, holder, d.mig.profile, None, d.mig.start))
        elif match := _MIG.match(d.device):
            gpu, profile_id, start = (int(g) for g in match.groups())
            out.append(_ClaimDevice(gpu, holder, None, profile_id, start))
        elif match := _GPU.match(d.device):
            out.append(_ClaimDevice(int(match.group(1)), holder))
    return out


@dataclass(frozen=True)
class HoldSources:
    """Where to read holds: the agent's DRA checkpoint and the kubelet (each optional)."""

    dra_checkpoint: Path | None = None
    pod_resources_socket: Path | None = None
    kubelet_dir: Path | None = None  # the device-plugin directory (its checkpoint)

    @classmethod
    def of_agent(
        cls, state_dir: Path, pod_resources_socket: Path | None, kubelet_dir: Path | None
    ) -> HoldSources:
        """The sources of the agent whose state directory is ``state_dir``."""
        return cls(checkpoint_path(state_dir), pod_resources_socket, kubelet_dir)

    def read(self) -> Holds:
        """Read every source now (call it under the MIG lock, right before planning)."""
        unknown: list[str] = []
        claims: list[_ClaimDevice] = []
        sources: list[str] = []
        if self.dra_checkpoint is not None:
            try:
                records = read_claims(self.dra_checkpoint)
            except FileNotFoundError:
                records = {}
            except (OSError, ValueError) as exc:
                unknown.append(f"DRA checkpoint {self.dra_checkpoint}: {exc}")
                records = {}
            else:
                sources.append("dra-checkpoint")
            for record in records.values():
                if not record.failed:  # a failed claim's devices are gone; it holds nothing
                    claims += _claim_devices(record)
        allocations: tuple[DeviceAllocation, ...] = ()
        try:
            allocations, source = device_allocations(self.pod_resources_socket, self.kubelet_dir)
            sources.append(source)
        except AllocationsUnavailableError as exc:
            unknown.append(str(exc))
        return Holds(
            tuple(claims),
            allocations,
            "; ".join(unknown) or None,
            self.dra_checkpoint,
            tuple(sources),
        )
