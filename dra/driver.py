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
MIG reconciler take. A failure is an error on its claim only; the others go ahead:

* the claim is read from the API server (concurrently for the claims of one call, outside the
  driver's lock) and parsed by one validating model (:mod:`nodeagent_dra.claim`), so any bad
  shape is that claim's error naming the field;
* only device names this node publishes are prepared (``published``);
* the kubelet's deadline is honoured at claim boundaries: a claim not reached in time gets an
  error saying so, and one that fails half way (a full disk, NVML refusing) is rolled back, so
  nothing is left half made;
* the driver's lock is held per claim, around what changes the node, never around API reads.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import KW_ONLY, InitVar, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

from nodeagent.capacity import memory_slices_of
from nodeagent.cdi import CdiDevice, CdiWriter, Mps, mig_cap_minors
from nodeagent.config.device_plugin import MpsSection
from nodeagent.gpu.errors import GpuError
from nodeagent.gpu.protocols import MigDevices
from nodeagent.gpu.types import GpuInstance, MigGeometry, MigProfile, Placement
from nodeagent.holds import Holds, HoldSources, describe
from nodeagent.runtime.lock import LockHeldError, ProcessLock
from nodeagent.runtime.mps import MpsSupervisor, MpsTarget
from nodeagent_dra.checkpoint import Checkpoint, ClaimRecord, MigIntent, MpsRecord, PreparedDevice
from nodeagent_dra.claim import ClaimShapeError, ResourceClaim, parse_claim
from nodeagent_dra.sharing import Share, SharingError, sharing_for
from nodeagent_dra.slices import DraDevice

log = logging.getLogger(__name__)

LOCK_TIMEOUT_S = 30.0  # how long a prepare waits for another MIG apply (kubelet allows 45 s)
PROC_CAPABILITIES = Path("/proc/driver/nvidia/capabilities")
# API reads of one call at a time: the API client keeps 5 connections per CPU, so 8 never
# overflow its pool, and 9 claims read at the default 5 s timeout take 10 s, not 45.
READS = 8
_Answer = TypeVar("_Answer")  # what prepare or unprepare answers for one claim


class PrepareError(Exception):
    """Preparing (or unpreparing) one claim failed; the message is for the claim's error."""


class ClaimSource(Protocol):
    """Where the plugin reads a ResourceClaim (the API server)."""

    def get(self, namespace: str, name: str, timeout_s: float | None = None) -> Any:
        """The claim as the API serves it (parsed JSON, any shape), waiting at most
        ``timeout_s`` (None: the source's own timeout). Raises PrepareError when it cannot be
        read."""
        ...


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A claim as the kubelet names it."""

    namespace: str
    uid: str
    name: str

    def problem(self) -> str | None:
        """What the kubelet left out of the reference (it must name all three), or None."""
        missing = [f for f in ("namespace", "uid", "name") if not getattr(self, f)]
        if not missing:
            return None
        return f"the kubelet's request names a claim without {' or '.join(missing)}"


@dataclass(frozen=True, slots=True)
class Deadline:
    """How long the kubelet waits for a call: ``at`` in ``time.monotonic()`` seconds (None: no
    deadline); ``waiting`` turns false when it gave up earlier (the call was cancelled)."""

    at: float | None = None
    waiting: Callable[[], bool] = lambda: True

    @classmethod
    def within(cls, seconds: float | None, waiting: Callable[[], bool] = lambda: True) -> Deadline:
        """A deadline ``seconds`` from now (None: none)."""
        return cls(None if seconds is None else time.monotonic() + seconds, waiting)

    def left(self) -> float | None:
        """Seconds left (never below 0), or None without a deadline."""
        return None if self.at is None else max(0.0, self.at - time.monotonic())

    def passed(self) -> bool:
        """Whether the kubelet stopped waiting."""
        return (self.at is not None and time.monotonic() >= self.at) or not self.waiting()


NO_DEADLINE = Deadline()
NOT_REACHED = (
    "the kubelet's deadline for the call passed before this claim was reached; nothing was "
    "done for it, the kubelet retries"
)


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
    # The devices this node publishes (name -> what it stands for), None before the first
    # publication: only those names are prepared.
    published: Callable[[], Mapping[str, DraDevice] | None]
    on_change: Callable[[], None] = lambda: None
    lock_timeout_s: float = LOCK_TIMEOUT_S
    proc_capabilities: Path = PROC_CAPABILITIES
    # What workloads hold (nodeagent.holds): unprepare never destroys an instance another
    # claim or a pod holds. None: the other claims of this checkpoint only.
    holds: Callable[[], Holds] | None = None
    # The MPS control daemons' settings (default: under state_dir).
    mps_section: InitVar[MpsSection | None] = None
    # The kubelet may call concurrently; claims go in turn (the lock is held per claim).
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

    def prepare(
        self, refs: Sequence[ClaimRef], deadline: Deadline = NO_DEADLINE
    ) -> dict[str, Outcome]:
        """Prepare each claim; every claim of ``refs`` is in the answer, with its devices or
        its own error. Claims are read from the API concurrently and without the driver's
        lock, and each is prepared as soon as it is read."""
        reads: dict[str, Any | PrepareError] = {}
        table: list[Mapping[str, DraDevice] | None] = []  # read once per call, when needed

        def published() -> Mapping[str, DraDevice] | None:
            if not table:
                table.append(self.published())
            return table[0]

        def prepare_one(ref: ClaimRef) -> tuple[Outcome, bool]:
            devices, made = self._prepare(ref, reads.get(ref.uid), published, deadline)
            return Outcome(devices), made

        return self._each_claim(
            "prepare",
            self._as_read(refs, reads, deadline),
            deadline,
            prepare_one,
            lambda error: Outcome(error=error),
        )

    def _prepared_already(self, uid: str) -> bool:
        record = self.checkpoint.claims.get(uid)
        return record is not None and record.prepared

    def _as_read(
        self, refs: Sequence[ClaimRef], reads: dict[str, Any | PrepareError], deadline: Deadline
    ) -> Iterator[ClaimRef]:
        """``refs`` in the order they can be prepared: those that need no read first, then each
        as its read completes (into ``reads``: the JSON, or the PrepareError saying why it was
        not read), then those the deadline cut off (reads still waiting are cancelled)."""
        to_read = [r for r in refs if r.problem() is None and not self._prepared_already(r.uid)]
        unread = set(to_read)
        yield from (ref for ref in refs if ref not in unread)
        if not to_read:
            return
        pool = ThreadPoolExecutor(
            max_workers=min(READS, len(to_read)), thread_name_prefix="dra-read"
        )
        try:
            futures = {pool.submit(self._read_claim, ref, deadline): ref for ref in to_read}
            try:
                for future in as_completed(futures, timeout=deadline.left()):
                    ref = futures[future]
                    reads[ref.uid] = future.result()
                    yield ref
            except TimeoutError:
                pass  # the deadline passed: the rest are answered NOT_REACHED
            yield from (ref for ref in to_read if ref.uid not in reads)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _read_claim(self, ref: ClaimRef, deadline: Deadline) -> Any | PrepareError:
        if deadline.passed():
            return PrepareError(NOT_REACHED)
        try:
            return self.claims.get(ref.namespace, ref.name, deadline.left())
        except PrepareError as exc:
            return exc
        except Exception as exc:  # noqa: BLE001 - a source's defect fails its claim only
            log.error("reading claim %s/%s failed: %s: %s", ref.namespace, ref.name,
                      type(exc).__name__, exc)  # fmt: skip
            return PrepareError(f"cannot read claim {ref.namespace}/{ref.name}: {exc}")

    @contextlib.contextmanager
    def _turn(self, deadline: Deadline) -> Iterator[None]:
        """The driver's lock for one claim, given up when the deadline passes first."""
        if deadline.passed():
            raise PrepareError(NOT_REACHED)
        left = deadline.left()
        if not self._serial.acquire(timeout=-1 if left is None else left):
            raise PrepareError(
                "the kubelet's deadline for the call passed while another call was being "
                "served; nothing was done for this claim, the kubelet retries"
            )
        try:
            yield
        finally:
            self._serial.release()

    def _each_claim(
        self,
        what: str,
        refs: Iterable[ClaimRef],
        deadline: Deadline,
        step: Callable[[ClaimRef], tuple[_Answer, bool]],
        failed: Callable[[str], _Answer],
    ) -> dict[str, _Answer]:
        """Run ``step`` (answer, changed the node) on each claim in turn, each under the lock,
        ``failed`` answering a claim whose step raised or that the deadline left out;
        ``on_change`` once when any step changed the node."""
        out: dict[str, _Answer] = {}
        changed = False
        late: list[ClaimRef] = []  # logged in one line: a call cut short may leave hundreds
        for ref in refs:
            try:
                problem = ref.problem()
                if problem is not None:
                    raise PrepareError(problem)
                with self._turn(deadline):
                    out[ref.uid], made = step(ref)
                changed |= made
            except PrepareError as exc:
                if str(exc) == NOT_REACHED:
                    late.append(ref)
                else:
                    log.warning("%s of claim %s/%s failed: %s", what, ref.namespace, ref.name, exc)
                out[ref.uid] = failed(str(exc))
            except Exception as exc:
                log.error(
                    "%s of claim %s/%s failed unexpectedly: %s: %s",
                    what,
                    ref.namespace,
                    ref.name,
                    type(exc).__name__,
                    exc,
                    exc_info=log.isEnabledFor(logging.DEBUG),
                )
                out[ref.uid] = failed(
                    f"{what} of claim {ref.namespace}/{ref.name} failed unexpectedly "
                    f"({type(exc).__name__}: {exc}); the agent's log has more"
                )
        if late:
            names = ", ".join(f"{r.namespace}/{r.name}" for r in late[:5])
            log.warning(
                "%s: the kubelet's deadline passed before %d claim(s) were reached (%s%s); "
                "nothing was done for them, the kubelet retries",
                what,
                len(late),
                names,
                ", ..." if len(late) > 5 else "",
            )
        if changed:
            self.on_change()
        return out

    def _claim(self, ref: ClaimRef, raw: Any | PrepareError | None) -> ResourceClaim:
        """The claim the API answered for ``ref``, checked to be that claim."""
        if raw is None:
            raise PrepareError(NOT_REACHED)
        if isinstance(raw, PrepareError):
            raise raw
        try:
            claim = parse_claim(raw)
        except ClaimShapeError as exc:
            raise PrepareError(f"claim {ref.namespace}/{ref.name} is malformed: {exc}") from None
        meta = claim.metadata
        if meta.uid != ref.uid:
            raise PrepareError(
                f"claim {ref.namespace}/{ref.name} has UID {meta.uid}, not {ref.uid} "
                "(it was replaced)"
            )
        if (meta.namespace, meta.name) != (ref.namespace, ref.name):
            raise PrepareError(
                f"the API server answered claim {meta.namespace}/{meta.name} for "
                f"{ref.namespace}/{ref.name}"
            )
        return claim

    def _prepare(
        self,
        ref: ClaimRef,
        raw: Any | PrepareError | None,
        published: Callable[[], Mapping[str, DraDevice] | None],
        deadline: Deadline,
    ) -> tuple[tuple[PreparedDevice, ...], bool]:
        record = self.checkpoint.claims.get(ref.uid)
        if record is not None and (failed := self.checkpoint.failure(ref.uid)):
            # `mig apply --force` took its devices: answering them again (or making new ones
            # for a claim its pod believes failed) would hand out a dead device.
            raise PrepareError(f"claim {ref.namespace}/{ref.name} failed: {failed}")
        if record is not None and record.prepared:
            return record.devices, False
        claim = self._claim(ref, raw)
        allocation = claim.allocation
        if allocation is None:
            raise PrepareError(f"claim {ref.namespace}/{ref.name} is not allocated")
        results = [
            r
            for r in allocation.devices.results
            if r.driver == self.driver_name and r.pool == self.pool_name
        ]
        try:
            sharing = sharing_for(allocation.devices.config, self.driver_name)
        except SharingError as exc:
            raise PrepareError(f"claim {ref.namespace}/{ref.name}: {exc}") from exc
        # Several results of one claim may name the same device (requests sharing it).
        by_device: dict[str, list[str]] = {}
        for r in results:
            by_device.setdefault(r.device, []).append(r.request.split("/")[0])
        table = published() if by_device else {}
        if table is None:
            raise PrepareError(
                "this node has not published its devices yet (the agent is starting); "
                "the kubelet retries"
            )
        mine = self._mine(ref.uid)
        targets = [self._resolve(name, ref, mine, table) for name in by_device]
        shares = []
        for target in targets:
            requests = by_device[target.name]
            shares.append(next((sharing[r] for r in requests if r in sharing), sharing.get("*")))
        try:
            return self._make(ref, targets, by_device, shares, mine, table, deadline)
        except (PrepareError, OSError) as exc:
            # Nothing half made: no instance, CDI spec, daemon or record of a claim not prepared.
            self._abandon(ref, any(s is not None and s.mps for s in shares))
            if isinstance(exc, PrepareError):
                raise
            raise PrepareError(
                f"claim {ref.namespace}/{ref.name} not prepared: {exc}; nothing was left "
                "behind, the kubelet retries"
            ) from exc

    def _make(
        self,
        ref: ClaimRef,
        targets: list[_Target],
        by_device: Mapping[str, list[str]],
        shares: Sequence[Share | None],
        mine: set[tuple[int, str, int]],
        table: Mapping[str, DraDevice],
        deadline: Deadline,
    ) -> tuple[tuple[PreparedDevice, ...], bool]:
        """Make the claim's devices: instances, MPS daemons, CDI spec, then the checkpoint."""
        made = False
        # Every claim with a device goes through the MIG lock, also one that only adopts an
        # existing instance or takes a whole GPU: it is written down as holding them before the
        # lock is let go, so no `mig apply` plans between this read of the node and the claim's
        # record (issue 32).
        if targets:
            made = self._make_instances(ref, targets, by_device, mine, deadline)
            mine = self._mine(ref.uid)
            targets = [self._resolve(t.name, ref, mine, table) for t in targets]
        for target, share in zip(targets, shares, strict=True):
            if (
                share is not None
                and share.strategy == "TimeSlicing"
                and share.interval != "Default"
            ):
                log.warning(
                    "claim %s/%s asks time-slice interval %s on %s: the GPU's time-slice is "
                    "not set by the driver (NVML has no call for it; docs/dra.md says what to do)",
                    ref.namespace,
                    ref.name,
                    share.interval,
                    target.name,
                )
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

    def _abandon(self, ref: ClaimRef, had_mps: bool) -> None:
        """Undo a prepare that failed part way: destroy the instances made for the claim (it was
        never prepared, so nothing runs on them), remove its CDI spec, forget it and stop the
        daemons no prepared claim needs."""
        record = self.checkpoint.claims.get(ref.uid)  # made by this prepare, or a failed one
        if record is not None:
            # A claim `mig apply --force` failed meanwhile lost its instances, and NVML reuses
            # instance IDs: its IDs may name someone else's instances now (issue 32).
            failed = self.checkpoint.failure(ref.uid)
            made = [
                (d.mig.gpu_index, d.mig.instance_id)
                for d in record.devices
                if d.mig is not None and d.mig.instance_id is not None and not failed
            ]
            try:
                if made:  # every MIG change holds the node's MIG lock, a roll-back's too
                    self.mig_lock.acquire(self.lock_timeout_s)
            except (LockHeldError, OSError) as exc:
                log.error(
                    "instances of claim %s/%s not rolled back (%s); kept in the checkpoint: a "
                    "retry adopts them, an unprepare destroys them", ref.namespace, ref.name, exc,
                )  # fmt: skip
            else:
                try:
                    self._roll_back(ref, made)
                finally:
                    if made:
                        self.mig_lock.release()
        try:
            self.cdi.remove(ref.uid)
        except OSError as exc:
            log.error("CDI spec of claim %s/%s not removed: %s", ref.namespace, ref.name, exc)
        if had_mps:
            self.mps.sync(self._mps_targets())

    def _intents_of(self, uid: str) -> list[MigIntent]:
        record = self.checkpoint.claims.get(uid)
        return [d.mig for d in record.devices if d.mig is not None] if record else []

    def _mine(self, uid: str) -> set[tuple[int, str, int]]:
        return {(i.gpu_index, i.profile, i.start) for i in self._intents_of(uid)}

    def _resolve(
        self,
        name: str,
        ref: ClaimRef,
        mine: set[tuple[int, str, int]],
        table: Mapping[str, DraDevice],
    ) -> _Target:
        """What the published device ``name`` is here now: a GPU, an existing MIG device or a
        placement. A name this node does not publish is refused, however it is spelled."""
        device = table.get(name)
        if device is None:
            raise PrepareError(
                f"device {name!r} is not one this node publishes "
                f"(driver {self.driver_name}, pool {self.pool_name})"
            )
        index = device.gpu_index
        info = self._info(index, name)
        if info.uuid != device.gpu_uuid:
            raise PrepareError(
                f"device {name}: GPU {index} is {info.uuid} now, not the published "
                f"{device.gpu_uuid}; the kubelet retries once the slices are published again"
            )
        minor = info.minor_number if info.minor_number is not None else index
        if device.kind == "gpu":
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
        geometry = self._geometry(index, name)
        profile = geometry.profile(device.profile) if device.profile is not None else None
        placement = device.placement
        if profile is None or placement is None or placement not in profile.placements:
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
        deadline: Deadline = NO_DEADLINE,
    ) -> bool:
        """Create the claim's dynamic instances under the MIG lock: intent, create, confirm; the
        devices it takes as they are (an existing instance, a whole GPU) are recorded under the
        same lock. Returns whether an instance was made (or adopted after a restart)."""
        left = deadline.left()
        try:
            self.mig_lock.acquire(
                self.lock_timeout_s if left is None else min(left, self.lock_timeout_s)
            )
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
            adopted = [t for t in targets if not _needs_instance(t, mine)]
            for t in adopted:  # still there now that no apply can run?
                if t.profile is None:  # a whole GPU, read with MIG off
                    if self.node.info(t.gpu_index).mig_enabled:
                        raise PrepareError(
                            f"{t.name} went into MIG mode (a MIG layout change); the kubelet "
                            "retries"
                        )
                    continue
                assert t.existing is not None  # not _needs_instance
                if not any(
                    gi.instance_id == t.existing.instance_id and gi.placement == t.placement
                    for gi in self.node.mig_instances(t.gpu_index)
                ):
                    raise PrepareError(
                        f"{t.name} went away (a MIG layout change); the kubelet retries"
                    )
            held = [
                PreparedDevice(tuple(by_device[t.name]), self.pool_name, t.name) for t in adopted
            ]
            # Intents first: update_device below counts on their positions.
            self.checkpoint.put(ClaimRecord(ref.uid, ref.namespace, ref.name, (*intents, *held)))
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
        except (PrepareError, OSError):  # OSError: the checkpoint cannot be written
            self._roll_back(ref, created)
            raise
        finally:
            self.mig_lock.release()
        return bool(intents)  # the node changed only where an instance was made (or adopted)

    def _roll_back(self, ref: ClaimRef, created: Sequence[tuple[int, int]]) -> None:
        """Destroy what this attempt created (idle by definition) and forget the claim."""
        for index, instance_id in created:
            try:
                self.node.destroy_gpu_instance(index, instance_id)
            except GpuError as exc:
                log.error("could not roll back instance %d on GPU %d: %s", instance_id, index, exc)
                return  # keep the intents: a retry adopts, an unprepare destroys
        try:
            self.checkpoint.drop(ref.uid)
        except OSError as exc:
            # Forgotten in memory all the same: the next write of the checkpoint drops it.
            self.checkpoint.claims.pop(ref.uid, None)
            log.error(
                "claim %s/%s rolled back, but the checkpoint was not written: %s",
                ref.namespace,
                ref.name,
                exc,
            )

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

    def unprepare(
        self, refs: Sequence[ClaimRef], deadline: Deadline = NO_DEADLINE
    ) -> dict[str, str]:
        """Unprepare each claim: claim UID -> error ('' when done)."""
        return self._each_claim(
            "unprepare", refs, deadline, lambda ref: ("", self._unprepare(ref, deadline)), str
        )

    def _unprepare(self, ref: ClaimRef, deadline: Deadline = NO_DEADLINE) -> bool:
        record = self.checkpoint.claims.get(ref.uid)
        if record is None:
            return False  # never prepared here, or unprepared already
        # A claim `mig apply --force` failed lost its instances: whatever is at their placements
        # now belongs to someone else.
        failed = self.checkpoint.failure(ref.uid)
        intents = [d.mig for d in record.devices if d.mig is not None and not failed]
        if intents:
            left = deadline.left()
            try:
                self.mig_lock.acquire(
                    self.lock_timeout_s if left is None else min(left, self.lock_timeout_s)
                )
            except LockHeldError as exc:
                raise PrepareError(f"MIG layout busy: {exc}; the kubelet retries") from exc
            except OSError as exc:
                raise PrepareError(
                    f"cannot take the MIG lock {self.mig_lock.path}: {exc}; the kubelet retries"
                ) from exc
            try:
                for mig in intents:
                    self._destroy(ref, mig)
            except BaseException:
                self.mig_lock.release()
                raise
        try:
            self.cdi.remove(ref.uid)
            self.checkpoint.drop(ref.uid)
        except OSError as exc:
            # Kept in memory, so the kubelet's retry writes the checkpoint again (its instances
            # are gone already: the retry finds nothing left to destroy).
            self.checkpoint.claims.setdefault(ref.uid, record)
            raise PrepareError(
                f"claim {ref.namespace}/{ref.name} unprepared, but not forgotten: {exc}; "
                "the kubelet retries"
            ) from exc
        finally:
            if intents:
                # Held until the claim is forgotten: no `mig apply` sees the checkpoint point
                # at the instances just destroyed (issue 32).
                self.mig_lock.release()
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
            holds = (self.holds or HoldSources(self.checkpoint.path).read)()
            if holds.unknown is not None:
                raise PrepareError(
                    f"MIG {mig.profile}@{mig.start} on GPU {mig.gpu_index} not destroyed: cannot "
                    f"tell which workloads hold it ({holds.unknown}); the kubelet retries"
                )
            if held := holds.of_instance(gi, besides=ref.uid):
                log.warning(
                    "kept MIG %s@%d on GPU %d at unprepare of claim %s/%s: %s",
                    mig.profile, mig.start, mig.gpu_index, ref.namespace, ref.name,
                    describe(held),
                )  # fmt: skip
                return
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
