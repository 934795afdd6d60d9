"""NodePrepareResources / NodeUnprepareResources: what the DRA plugin does for each claim.

Both are idempotent and safe across restarts:

* a claim already prepared (in the checkpoint) is answered from the checkpoint;
* a dynamic MIG device is written down as an intent before the instance is created and
  confirmed after; a prepare that finds its own intent adopts the instance at that placement
  (a plugin killed between create and checkpoint never creates a second one);
* unprepare destroys only instances the plugin made, only when no process runs on them, and
  forgets the claim only once they are gone (a busy instance is an error for that claim, which
  the kubelet retries);
* a device of an MPS claim gets an MPS control daemon (:mod:`nodeagent.runtime.mps`), started
  when the first claim on it is prepared, stopped when the last is unprepared, and started
  again (or adopted, when it still answers) from the checkpoint after a restart.

Every MIG change holds the node-wide MIG lock, the one ``nodeagent mig apply`` and the agent's
MIG reconciler take. A failure is an error on its claim only; the others go ahead.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, InitVar, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

from nodeagent.capacity import memory_slices_of
from nodeagent.cdi import CdiDevice, CdiWriter, Mps, mig_cap_minors
from nodeagent.config.device_plugin import MpsSection
from nodeagent.gpu.errors import GpuError
from nodeagent.gpu.protocols import MigDevices
from nodeagent.gpu.types import GpuInstance, MigGeometry, MigProfile, Placement
from nodeagent.runtime.lock import LockHeldError, ProcessLock
from nodeagent.runtime.mps import MpsSupervisor, MpsTarget
from nodeagent_dra.checkpoint import Checkpoint, ClaimRecord, MigIntent, MpsRecord, PreparedDevice
from nodeagent_dra.sharing import Share, SharingError, sharing_for
from nodeagent_dra.slices import profile_token

log = logging.getLogger(__name__)

LOCK_TIMEOUT_S = 30.0  # how long a prepare waits for another MIG apply (kubelet allows 45 s)
PROC_CAPABILITIES = Path("/proc/driver/nvidia/capabilities")
_GPU = re.compile(r"^gpu-(\d+)$")
_MIG = re.compile(r"^gpu-(\d+)-mig-([a-z0-9-]+)-(\d+)-(\d+)$")
_Answer = TypeVar("_Answer")  # what prepare or unprepare answers for one claim


class PrepareError(Exception):
    """Preparing (or unpreparing) one claim failed; the message is for the claim's error."""


class ClaimSource(Protocol):
    """Where the plugin reads a ResourceClaim (the API server)."""

    def get(self, namespace: str, name: str) -> Mapping[str, Any]:
        """The claim as the API serves it (JSON). Raises PrepareError when it cannot be read."""
        ...


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A claim as the kubelet names it."""

    namespace: str
    uid: str
    name: str


@dataclass(frozen=True, slots=True)
class Outcome:
    """One claim's answer: devices, or an error."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


@dataclass(frozen=True, slots=True)
class _Target:
    """What one allocated device is on this node now."""

    name: str
    gpu_index: int
    gpu_uuid: str
    gpu_minor: int
    profile: MigProfile | None = None
    placement: Placement | None = None
    existing: GpuInstance | None = None  # the instance at that placement now


def _key(t: _Target) -> tuple[int, str, int]:
    assert t.profile is not None
    assert t.placement is not None
    return (t.gpu_index, t.profile.name, t.placement.start)


def _needs_instance(t: _Target, mine: set[tuple[int, str, int]]) -> bool:
    """A placement to create, or one this claim made before (to adopt and confirm)."""
    return t.profile is not None and (t.existing is None or _key(t) in mine)


@dataclass(eq=False)
class Driver:
    """The claims of one DRA driver on one node."""

    node: MigDevices
    claims: ClaimSource
    checkpoint: Checkpoint
    cdi: CdiWriter
    mig_lock: ProcessLock
    _: KW_ONLY
    driver_name: str
    pool_name: str
    dynamic_mig: bool
    state_dir: Path
    on_change: Callable[[], None] = lambda: None
    lock_timeout_s: float = LOCK_TIMEOUT_S
    proc_capabilities: Path = PROC_CAPABILITIES
    # The MPS control daemons' settings (default: under state_dir).
    mps_section: InitVar[MpsSection | None] = None
    # The kubelet may call concurrently; claims go in turn.
    _serial: threading.Lock = field(default_factory=threading.Lock, init=False)
    mps: MpsSupervisor = field(init=False)

    def __post_init__(self, mps_section: MpsSection | None) -> None:
        self.mps = MpsSupervisor(
            mps_section or MpsSection(root=self.state_dir / "dra" / "mps"),
            lambda: None,
            consequence="MPS claims on the device fail, or wait, until it answers",
        )

    # --- what the slices need ----------------------------------------------------------------

    def managed(self) -> frozenset[tuple[int, str, int]]:
        """(GPU, profile, start) of every instance the plugin made or is making."""
        return frozenset((i.gpu_index, i.profile, i.start) for i in self.checkpoint.intents())

    # --- prepare ----------------------------------------------------------------------------

    def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, Outcome]:
        """Prepare each claim; every claim of ``refs`` is in the answer."""

        def prepare_one(ref: ClaimRef) -> tuple[Outcome, bool]:
            devices, made = self._prepare(ref)
            return Outcome(devices), made

        return self._each_claim("prepare", refs, prepare_one, lambda error: Outcome(error=error))

    def _each_claim(
        self,
        what: str,
        refs: Sequence[ClaimRef],
        step: Callable[[ClaimRef], tuple[_Answer, bool]],
        failed: Callable[[str], _Answer],
    ) -> dict[str, _Answer]:
        """Run ``step`` (answer, changed the node) on each claim in turn, ``failed`` answering a
        claim whose step raised; ``on_change`` once when any step changed the node."""
        out: dict[str, _Answer] = {}
        changed = False
        with self._serial:
            for ref in refs:
                try:
                    out[ref.uid], made = step(ref)
                    changed |= made
                except PrepareError as exc:
                    log.warning("%s of claim %s/%s failed: %s", what, ref.namespace, ref.name, exc)
                    out[ref.uid] = failed(str(exc))
        if changed:
            self.on_change()
        return out

    def _prepare(self, ref: ClaimRef) -> tuple[tuple[PreparedDevice, ...], bool]:
        record = self.checkpoint.claims.get(ref.uid)
        if record is not None and record.prepared:
            return record.devices, False
        claim = self.claims.get(ref.namespace, ref.name)
        uid = claim.get("metadata", {}).get("uid")
        if uid != ref.uid:
            raise PrepareError(
                f"claim {ref.namespace}/{ref.name} has UID {uid}, not {ref.uid} (it was replaced)"
            )
        allocation = (claim.get("status") or {}).get("allocation")
        if not allocation:
            raise PrepareError(f"claim {ref.namespace}/{ref.name} is not allocated")
        results = [
            r
            for r in allocation.get("devices", {}).get("results", [])
            if r.get("driver") == self.driver_name and r.get("pool") == self.pool_name
        ]
        try:
            sharing = sharing_for(allocation, self.driver_name)
        except SharingError as exc:
            raise PrepareError(f"claim {ref.namespace}/{ref.name}: {exc}") from exc
        # Several results of one claim may name the same device (requests sharing it).
        by_device: dict[str, list[str]] = {}
        for r in results:
            by_device.setdefault(str(r["device"]), []).append(str(r["request"]).split("/")[0])
        mine = self._mine(ref.uid)
        targets = [self._resolve(name, ref, mine) for name in by_device]
        made = False
        if any(_needs_instance(t, mine) for t in targets):
            made = self._make_instances(ref, targets, by_device, mine)
            mine = self._mine(ref.uid)
            targets = [self._resolve(name, ref, mine) for name in by_device]
        shares = []
        for target in targets:
            requests = by_device[target.name]
            shares.append(next((sharing[r] for r in requests if r in sharing), sharing.get("*")))
        mps = [self._mps_record(t, share) for t, share in zip(targets, shares, strict=True)]
        self._start_mps(ref, targets, mps)
        cdi_devices = [
            self._cdi_device(t, share, m) for t, share, m in zip(targets, shares, mps, strict=True)
        ]
        ids = self.cdi.write(ref.uid, cdi_devices) if cdi_devices else []
        intents = {(i.gpu_index, i.profile, i.start): i for i in self._intents_of(ref.uid)}
        devices = tuple(
            PreparedDevice(
                requests=tuple(by_device[target.name]),
                pool=self.pool_name,
                device=target.name,
                cdi_ids=(cdi_id,),
                mig=intents.get(_key(target)) if target.profile is not None else None,
                mps=m,
            )
            for target, cdi_id, m in zip(targets, ids, mps, strict=True)
        )
        self.checkpoint.put(
            ClaimRecord(
                ref.uid, ref.namespace, ref.name, devices, prepared=True, since_s=time.time()
            )
        )
        log.info(
            "prepared claim %s/%s: %s",
            ref.namespace,
            ref.name,
            ", ".join(d.device for d in devices) or "no device of this node",
        )
        return devices, made

    def _intents_of(self, uid: str) -> list[MigIntent]:
        record = self.checkpoint.claims.get(uid)
        return [d.mig for d in record.devices if d.mig is not None] if record else []

    def _mine(self, uid: str) -> set[tuple[int, str, int]]:
        return {(i.gpu_index, i.profile, i.start) for i in self._intents_of(uid)}

    def _resolve(self, name: str, ref: ClaimRef, mine: set[tuple[int, str, int]]) -> _Target:
        """What the device ``name`` is here: a GPU, an existing MIG device or a placement."""
        if match := _GPU.match(name):
            index = int(match.group(1))
            info = self._info(index, name)
            minor = info.minor_number if info.minor_number is not None else index
            if not info.mig_enabled:
                return _Target(name, index, info.uuid, minor)
            if not self.dynamic_mig:
                raise PrepareError(f"GPU {index} is in MIG mode: claim one of its MIG devices")
            # The whole GPU of a dynamic MIG pool: the one instance that takes every slice.
            geometry = self._geometry(index, name)
            whole = max(geometry.profiles, key=lambda p: (memory_slices_of(p), p.multiprocessors))
            return self._placed(
                name, index, info.uuid, minor, whole, whole.placements[0], ref, mine
            )
        match = _MIG.match(name)
        if match is None:
            raise PrepareError(f"device {name!r} is not a device of driver {self.driver_name}")
        index, token, profile_id, start = (
            int(match.group(1)),
            match.group(2),
            int(match.group(3)),
            int(match.group(4)),
        )
        info = self._info(index, name)
        minor = info.minor_number if info.minor_number is not None else index
        geometry = self._geometry(index, name)
        profile = next((p for p in geometry.profiles if p.profile_id == profile_id), None)
        placement = (
            next((q for q in profile.placements if q.start == start), None) if profile else None
        )
        if profile is None or placement is None or profile_token(profile.name) != token:
            raise PrepareError(f"GPU {index} ({info.name}) has no MIG device {name}")
        return self._placed(name, index, info.uuid, minor, profile, placement, ref, mine)

    def _placed(
        self,
        name: str,
        index: int,
        uuid: str,
        minor: int,
        profile: MigProfile,
        placement: Placement,
        ref: ClaimRef,
        mine: set[tuple[int, str, int]],
    ) -> _Target:
        existing = next(
            (
                gi
                for gi in self.node.mig_instances(index)
                if gi.profile == profile.name and gi.placement == placement
            ),
            None,
        )
        key = (index, profile.name, placement.start)
        if existing is not None and key not in mine:
            holder = self._holder(key)
            if holder is not None:
                raise PrepareError(
                    f"{name} is prepared for claim {holder.namespace}/{holder.name} already"
                )
        if existing is None and not self.dynamic_mig:
            raise PrepareError(
                f"no MIG device {name} on GPU {index}, and dynamic MIG is off for this pool"
            )
        return _Target(name, index, uuid, minor, profile, placement, existing)

    def _holder(self, key: tuple[int, str, int]) -> ClaimRecord | None:
        for record in self.checkpoint.claims.values():
            for d in record.devices:
                if d.mig is not None and (d.mig.gpu_index, d.mig.profile, d.mig.start) == key:
                    return record
        return None

    def _info(self, index: int, name: str) -> Any:
        if not 0 <= index < self.node.count():
            raise PrepareError(f"device {name}: this node has no GPU {index}")
        try:
            return self.node.info(index)
        except GpuError as exc:
            raise PrepareError(f"device {name}: {exc}") from exc

    def _geometry(self, index: int, name: str) -> MigGeometry:
        geometry = self.node.mig_geometry(index)
        if geometry is None:
            raise PrepareError(f"device {name}: GPU {index} offers no MIG")
        return geometry

    def _make_instances(
        self,
        ref: ClaimRef,
        targets: Sequence[_Target],
        by_device: Mapping[str, list[str]],
        mine: set[tuple[int, str, int]],
    ) -> bool:
        """Create the claim's dynamic instances under the MIG lock: intent, create, confirm."""
        try:
            self.mig_lock.acquire(self.lock_timeout_s)
        except LockHeldError as exc:
            raise PrepareError(f"MIG layout busy: {exc}; the kubelet retries") from exc
        except OSError as exc:
            raise PrepareError(f"cannot take the MIG lock {self.mig_lock.path}: {exc}") from exc
        created: list[tuple[int, int]] = []
        try:
            intents = [
                PreparedDevice(
                    requests=tuple(by_device[t.name]),
                    pool=self.pool_name,
                    device=t.name,
                    mig=MigIntent(t.gpu_index, t.profile.name, t.placement.start, t.placement.size),
                )
                for t in targets
                if t.profile is not None and t.placement is not None and _needs_instance(t, mine)
            ]
            self.checkpoint.put(ClaimRecord(ref.uid, ref.namespace, ref.name, tuple(intents)))
            for n, device in enumerate(intents):
                mig = device.mig
                assert mig is not None
                placement = Placement(mig.start, mig.size)
                existing = next(
                    (
                        gi
                        for gi in self.node.mig_instances(mig.gpu_index)
                        if gi.profile == mig.profile and gi.placement == placement
                    ),
                    None,
                )
                if existing is None:
                    try:
                        existing = self.node.create_gpu_instance(
                            mig.gpu_index, mig.profile, placement
                        )
                    except GpuError as exc:
                        raise PrepareError(
                            f"cannot create {device.device} on GPU {mig.gpu_index}: {exc}"
                        ) from exc
                    created.append((mig.gpu_index, existing.instance_id))
                    log.info(
                        "created MIG %s@%d on GPU %d for claim %s/%s (instance %d)",
                        mig.profile,
                        mig.start,
                        mig.gpu_index,
                        ref.namespace,
                        ref.name,
                        existing.instance_id,
                    )
                else:
                    log.info(
                        "adopted MIG %s@%d on GPU %d for claim %s/%s (made before a restart)",
                        mig.profile,
                        mig.start,
                        mig.gpu_index,
                        ref.namespace,
                        ref.name,
                    )
                confirmed = replace(mig, instance_id=existing.instance_id, uuid=existing.uuid)
                self.checkpoint.update_device(ref.uid, n, replace(device, mig=confirmed))
        except PrepareError:
            self._roll_back(ref, created)
            raise
        finally:
            self.mig_lock.release()
        return True

    def _roll_back(self, ref: ClaimRef, created: Sequence[tuple[int, int]]) -> None:
        """Destroy what this attempt created (idle by definition) and forget the claim."""
        for index, instance_id in created:
            try:
                self.node.destroy_gpu_instance(index, instance_id)
            except GpuError as exc:
                log.error("could not roll back instance %d on GPU %d: %s", instance_id, index, exc)
                return  # keep the intents: a retry adopts, an unprepare destroys
        self.checkpoint.drop(ref.uid)

    def _cdi_device(
        self, target: _Target, share: Share | None, mps_record: MpsRecord | None
    ) -> CdiDevice:
        if target.profile is None:
            uuids: tuple[str, ...] = (target.gpu_uuid,)
            caps: tuple[int, ...] = ()
        else:
            uuids = (self._device_uuid(target),)
            existing = target.existing
            assert existing is not None  # _device_uuid checked
            ci = existing.compute_instances[0].instance_id
            caps = mig_cap_minors(
                self.proc_capabilities, target.gpu_minor, existing.instance_id, ci
            )
        mps = None
        if mps_record is not None:
            daemon = self.mps.daemon(mps_record.uuid)
            assert daemon is not None  # _start_mps started it
            mps = Mps(
                daemon.pipe_dir,
                daemon.log_dir,
                mps_record.active_thread_percentage,
                mps_record.pinned_memory_limit_mib,
            )
        env = share.env if share is not None else ()
        return CdiDevice(target.name, uuids, (target.gpu_minor,), caps, mps, env)

    @staticmethod
    def _device_uuid(target: _Target) -> str:
        """The UUID containers see the device by: the GPU's, or the MIG device's."""
        if target.profile is None:
            return target.gpu_uuid
        existing = target.existing
        if existing is None or existing.uuid is None:
            raise PrepareError(f"{target.name}: the MIG instance has no compute instance")
        return existing.uuid

    def _mps_record(self, target: _Target, share: Share | None) -> MpsRecord | None:
        uuid = self._device_uuid(target)
        if share is None or not share.mps:
            return None
        return MpsRecord(
            uuid, target.gpu_index, share.active_thread_percentage, share.pinned_memory_limit_mib
        )

    # --- MPS control daemons ----------------------------------------------------------------

    def _mps_targets(self, extra: Sequence[MpsRecord] = ()) -> dict[str, MpsTarget]:
        """One daemon per device of the prepared MPS claims (and ``extra``); the oldest claim
        on a device sets its daemon's defaults."""
        out: dict[str, MpsTarget] = {}
        records = [m for _r, _d, m in self.checkpoint.mps_daemons()] + list(extra)
        for m in records:
            out.setdefault(
                m.uuid,
                MpsTarget(m.uuid, m.gpu_index, 1, m.active_thread_percentage,
                          m.pinned_memory_limit_mib),
            )  # fmt: skip
        return out

    def _start_mps(
        self, ref: ClaimRef, targets: Sequence[_Target], mps: Sequence[MpsRecord | None]
    ) -> None:
        """Start (or keep) the daemons this claim needs; PrepareError when one does not answer."""
        wanted = [m for m in mps if m is not None]
        if not wanted:
            return
        self.mps.sync(self._mps_targets(wanted))
        names = {m.uuid: t.name for t, m in zip(targets, mps, strict=True) if m is not None}
        failed = [(uuid, self.mps.daemon(uuid)) for uuid in names if not self.mps.ready(uuid)]
        if not failed:
            return
        # No daemon left behind for a claim not prepared.
        self.mps.sync(self._mps_targets())
        reasons = "; ".join(
            f"{names[uuid]}: {daemon.last_error if daemon else 'not started'}"
            for uuid, daemon in failed
        )
        raise PrepareError(
            f"claim {ref.namespace}/{ref.name}: MPS control daemon did not start ({reasons})"
        )

    def restore_mps(self) -> None:
        """Start again (or adopt, when they still answer) the daemons of the claims in the
        checkpoint: at agent start, before the kubelet is served."""
        targets = self._mps_targets()
        if not targets:
            return
        self.mps.sync(targets)
        for record, device, mps in self.checkpoint.mps_daemons():
            if self.mps.ready(mps.uuid):
                log.info(
                    "MPS daemon for %s of claim %s/%s answers",
                    device.device,
                    record.namespace,
                    record.name,
                )

    def check_mps(self) -> bool:
        """Start daemons that stopped answering again (at most every check interval)."""
        return self.mps.check()

    # --- unprepare --------------------------------------------------------------------------

    def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str]:
        """Unprepare each claim: claim UID -> error ('' when done)."""
        return self._each_claim("unprepare", refs, lambda ref: ("", self._unprepare(ref)), str)

    def _unprepare(self, ref: ClaimRef) -> bool:
        record = self.checkpoint.claims.get(ref.uid)
        if record is None:
            return False  # never prepared here, or unprepared already
        intents = [d.mig for d in record.devices if d.mig is not None]
        if intents:
            try:
                self.mig_lock.acquire(self.lock_timeout_s)
            except LockHeldError as exc:
                raise PrepareError(f"MIG layout busy: {exc}; the kubelet retries") from exc
            try:
                for mig in intents:
                    self._destroy(ref, mig)
            finally:
                self.mig_lock.release()
        self.cdi.remove(ref.uid)
        self.checkpoint.drop(ref.uid)
        if any(d.mps is not None for d in record.devices):
            self.mps.sync(self._mps_targets())  # stops daemons no prepared claim needs
        log.info("unprepared claim %s/%s", ref.namespace, ref.name)
        return bool(intents)

    def _destroy(self, ref: ClaimRef, mig: MigIntent) -> None:
        placement = Placement(mig.start, mig.size)
        for gi in self.node.mig_instances(mig.gpu_index):
            if gi.profile != mig.profile or gi.placement != placement:
                continue
            if gi.busy:
                raise PrepareError(
                    f"MIG {mig.profile}@{mig.start} on GPU {mig.gpu_index} still runs processes "
                    f"{', '.join(map(str, gi.pids))}: not destroyed; the kubelet retries"
                )
            try:
                self.node.destroy_gpu_instance(mig.gpu_index, gi.instance_id)
            except GpuError as exc:
                raise PrepareError(f"cannot destroy {mig.profile}@{mig.start}: {exc}") from exc
            log.info(
                "destroyed MIG %s@%d on GPU %d (claim %s/%s unprepared)",
                mig.profile,
                mig.start,
                mig.gpu_index,
                ref.namespace,
                ref.name,
            )
