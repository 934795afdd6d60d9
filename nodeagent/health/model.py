"""The health model: per-device state from events and snapshot checks, and the node score.

Every condition is a *fault* on a scope: a whole GPU (by UUID) or one MIG GPU instance of it.
A fault stays active while it is observed and for a hold time after it was last seen: the quiet
period (``health.recovery_quiet_s``) for conditions, and ``health.fatal_hold_s`` for events that
need a reset or worse (an XID leaves no readable "cleared" flag behind). A device's state is the
worst of the faults that apply to it: a GPU sees its own faults; a MIG device sees its GPU's
faults plus those of its GPU instance.

Transitions are delivered synchronously on the thread that caused them (the event thread for
XIDs, the sampler thread for snapshot checks), so the device plugin hears of an XID within the
time it takes to run the callbacks; each is logged in one line.

Restarts never shorten a hold (docs/health.md, "Across restarts"): while a fault is observed,
its ``last`` time is written to the history at least every :data:`HISTORY_REFRESH_S` (at once,
from the sample, when it is seen again after a longer gap, as after a restart), and a restored
fault counts as seen :data:`RESTORE_SLACK_S` after its saved ``last``. Every restored
fault is *carried* until the first sample: seen again there, it is the same incident (no new
weight in the score, however long the agent was down); not seen, it then expires by its hold.
A history that cannot be used is moved aside, and the node starts from the last published
status, or as ``unknown`` until the first sample, never as "stable" by default.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, TypeAdapter

from nodeagent.atomicfile import StateFileError, WriteFaults, read_json_as, write_json_atomic
from nodeagent.config.health import HealthSection
from nodeagent.gpu.inventory import unknown_gpu_id
from nodeagent.gpu.types import EventKind, GpuEvent, NodeSnapshot
from nodeagent.health.checks import NODE_WIDE_KEYS, Observation, SnapshotChecks
from nodeagent.health.score import (
    HISTORY_VERSION,
    FaultRecord,
    Finite,
    KnownLevel,
    SavedScore,
    StabilityLevel,
    StabilityScore,
)
from nodeagent.health.xids import Action, XidPolicy, strongest
from nodeagent.runtime.health_source import DeviceHealth, HealthState, HealthTransition
from nodeagent.runtime.subscribers import Subscribers

log = logging.getLogger(__name__)

# While a fault is observed, its last-seen time reaches the history at least this often (one
# fsync'd write per interval while faults last, not one per sample).
HISTORY_REFRESH_S = 5.0
# What a restored fault's saved last-seen time may lag the truth by: the refresh interval plus
# the reporter's pace (it saves once a second); a restored fault counts as seen that much later.
RESTORE_SLACK_S = 2 * HISTORY_REFRESH_S
# Where an unusable history is kept for inspection: history.json -> history.json.unusable-<time>.
UNUSABLE_SUFFIX = ".unusable-"
# The key of a fault restored from the published status (the history was unusable).
PUBLISHED_KEY = "published"

Clock = Callable[[], float]
TransitionCallback = Callable[[HealthTransition], None]

_STATE_ORDER = (HealthState.HEALTHY, HealthState.DEGRADED, HealthState.UNHEALTHY, HealthState.LOST)


def severity(state: HealthState) -> int:
    """Position of ``state`` in the order healthy < degraded < unhealthy < lost."""
    return _STATE_ORDER.index(state)


def fault_weight(state: HealthState, action: Action) -> float:
    """Severity weight of a fault onset in the stability score (table in docs/health.md)."""
    if state is HealthState.LOST:
        return 10.0
    if state is HealthState.UNHEALTHY:
        return 8.0 if action.rank >= Action.REBOOT_NODE.rank else 4.0
    if state is HealthState.DEGRADED:
        return 1.0
    return 0.25 if action is Action.RESTART_APP else 0.0


@dataclass
class Fault:
    """An active condition on one scope (in the history file under the short names)."""

    gpu_index: Annotated[int, Field(alias="gpu")]
    gpu_uuid: Annotated[str, Field(alias="uuid")]
    gpu_instance_id: Annotated[int | None, Field(alias="gi")]
    key: str
    state: HealthState
    reason: str
    action: Action
    first_s: Annotated[float, Field(alias="first", allow_inf_nan=False)]
    last_s: Annotated[float, Field(alias="last", allow_inf_nan=False)]
    hold_s: Annotated[float, Field(alias="hold", allow_inf_nan=False)]
    count: int = 1
    # last_s as the history file has it (not written: what the file holds is last_s)
    saved_last_s: Annotated[float, Field(exclude=True)] = field(default=-math.inf, compare=False)

    def expired(self, now_s: float) -> bool:
        """Whether the condition has been quiet for its whole hold time."""
        return now_s - self.last_s >= self.hold_s


class SavedHistory(BaseModel):
    """The history file: the score's state and the active faults (see the module doc).

    Strict: a damaged or hand-edited file is set aside with its first bad field named, never
    half-read. Keys this version does not know (``saved_s``, for one) are ignored.
    """

    model_config = ConfigDict(strict=True, frozen=True, defer_build=True)

    version: Literal[1]  # HISTORY_VERSION
    score: SavedScore = Field(default_factory=SavedScore)
    faults: tuple[Fault, ...] = ()


# Like every state-file schema (defer_build), built when a file is first read or written, not at
# import: a command that never touches the history does not pay about 30 ms for it.
_HISTORY = TypeAdapter(SavedHistory)


def _action(value: object) -> Action:
    """A published action; one this version does not know asks for investigation."""
    if str(value).startswith((VALIDATION_WAIT_ACTION, VALIDATION_RETRY_ACTION)):
        return Action.NONE  # a validation hold: it is held again when its fault expires
    try:
        return Action(str(value))
    except ValueError:
        return Action.DRAIN_INVESTIGATE


class _PublishedDevice(BaseModel):
    model_config = ConfigDict(strict=True, frozen=True, defer_build=True)

    uuid: str
    gpu: int
    parent: str | None = None  # a MIG device's GPU: MIG devices follow their GPU
    state: HealthState
    reasons: tuple[str, ...] = ()
    action: Annotated[Action, PlainValidator(_action)] = Action.NONE
    since_s: Finite


class _PublishedStability(BaseModel):
    model_config = ConfigDict(strict=True, frozen=True, defer_build=True)

    level: KnownLevel
    score: Finite


class _PublishedStatus(BaseModel):
    """What a restart takes from the status file the agent last published (statefile.to_json)."""

    model_config = ConfigDict(strict=True, frozen=True, defer_build=True)

    timestamp_s: Finite
    stability: _PublishedStability
    devices: tuple[_PublishedDevice, ...] = ()


_PUBLISHED = TypeAdapter(_PublishedStatus)


@dataclass
class _Gpu:
    """What the model knows about one physical GPU's devices."""

    index: int
    uuid: str
    mig: dict[str, int | None] = field(default_factory=dict)  # MIG UUID -> GPU instance ID


@dataclass(frozen=True, slots=True)
class NodeHealth:
    """Everything the reporter, the CLI and the exporter show about the node."""

    timestamp_s: float
    level: StabilityLevel
    score: float
    flapping: bool
    transitions_in_window: int
    devices: tuple[DeviceHealth, ...]  # GPUs then MIG devices, by GPU index
    mig_parent: Mapping[str, str]  # MIG UUID -> GPU UUID
    driver_version: str | None
    events_total: Mapping[str, int]  # by event kind
    xids_total: Mapping[tuple[str, int], int]  # by (GPU UUID, XID)
    xid_last_s: Mapping[tuple[str, int], float]
    history_errors: int = 0  # unusable history files moved aside since the agent started

    @property
    def known(self) -> bool:
        """False until the node's health is known (level ``unknown``): nothing to publish yet."""
        return self.level is not StabilityLevel.UNKNOWN

    @property
    def worst(self) -> HealthState:
        """The worst state of any device (healthy with no devices)."""
        return max((d.state for d in self.devices), key=severity, default=HealthState.HEALTHY)


VALIDATION_KEY = "validation"
VALIDATION_HOLD_S = 10 * 365 * 86400.0  # held until released, not timed out
# What a GPU held for validation shows as its action: the hold itself needs nothing from the
# operator until a step fails, and then what to fix and when the steps run again (never a bare
# "none" on an unhealthy GPU). Both read back as Action.NONE from a published status.
VALIDATION_WAIT_ACTION = "wait: the remediation steps run now; it serves again when they pass"
VALIDATION_RETRY_ACTION = "fix what the failed step reports (see the reason); the steps re-run"


class HealthModel:
    """Implements :class:`~nodeagent.runtime.health_source.HealthSource` over events, snapshots."""

    def __init__(
        self,
        config: HealthSection,
        *,
        expected_driver: str | None = None,
        history_path: Path | None = None,
        status_path: Path | None = None,
        clock: Clock = time.time,
        read_only: bool = False,
    ) -> None:
        self.config = config
        self.policy = XidPolicy(frozenset(config.ignore_xids), frozenset(config.fatal_xids))
        self.checks = SnapshotChecks(config, expected_driver)
        self.score = StabilityScore(config)
        self.history_path = history_path
        self._clock = clock
        self._lock = threading.RLock()
        self._deliver_lock = threading.Lock()  # keeps transitions in order across threads
        self._faults: dict[tuple[str, int | None, str], Fault] = {}
        self._gpus: dict[str, _Gpu] = {}
        self._health: dict[str, DeviceHealth] = {}
        self._subscribers: Subscribers[HealthTransition] = Subscribers("health subscriber")
        self._listeners: Subscribers[None] = Subscribers("health listener")
        self._driver_version: str | None = None
        self._events: Counter[str] = Counter()
        self._xids: Counter[tuple[str, int]] = Counter()
        self._xid_last: dict[tuple[str, int], float] = {}
        self.dirty = False  # history changed since the last save
        self.snapshots_seen = 0
        self.history_errors = 0
        # Hold a GPU whose unhealthy fault cleared until its remediation steps pass
        # (pools.<pool>.remediation.enabled); the validator releases it.
        self.validation_hold = False
        self._validation_retry_s: dict[str, float] = {}  # GPU UUID -> retry_s of its last failure
        self.status_path = status_path
        self.read_only = read_only  # a one-shot look (the CLI): never move or write files
        # The history and the published status (the reporter's) that cannot be written: a full
        # disk logs one line, not one per report, and the faults stay in memory meanwhile.
        self.write_faults = WriteFaults(
            log,
            "health state",
            "the last good files are kept, the health stays in memory and every report retries",
        )
        # Faults restored from disk, kept whatever their age until the first sample decides.
        self._carried: set[tuple[str, int | None, str]] = set()
        self._keys: dict[int, set[str]] = {}  # fault keys per GPU index at the last recompute
        self._behind = False  # a fault's last sighting is further ahead than the file allows
        # Whether the node's state is known before the first sample (from a history or the
        # published status); a node that knows nothing is "unknown" until it has sampled.
        self._known_at_start = False
        if history_path is not None:
            self._restore(history_path)

    # --- HealthSource --------------------------------------------------------------------------
    def device_health(self) -> Mapping[str, DeviceHealth]:
        """Current health of every known device, keyed by GPU UUID and MIG device UUID."""
        with self._lock:
            return dict(self._health)

    def subscribe(self, callback: TransitionCallback) -> Callable[[], None]:
        """Call ``callback`` on every state transition, on the thread that caused it."""
        return self._subscribers.add(callback)

    def add_listener(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` after any change (state, reasons, faults): the reporter's hook."""
        return self._listeners.add(lambda _: callback())

    # --- validation before a GPU serves again --------------------------------------------------
    def _hold_for_validation(
        self, gone: Mapping[tuple[str, int | None, str], Fault], now: float
    ) -> None:
        """A GPU whose last unhealthy fault just cleared is held until its validation passes."""
        bad = (HealthState.UNHEALTHY, HealthState.LOST)
        for (uuid, _, key), fault in gone.items():
            if fault.state not in bad or key == VALIDATION_KEY:
                continue
            if any(u == uuid and f.state in bad for (u, _, _), f in self._faults.items()):
                continue  # still unhealthy for another reason
            self._faults[(uuid, None, VALIDATION_KEY)] = Fault(
                fault.gpu_index,
                uuid,
                None,
                VALIDATION_KEY,
                HealthState.UNHEALTHY,
                f"awaiting validation after: {fault.reason}",
                Action.NONE,
                now,
                now,
                VALIDATION_HOLD_S,
            )
            log.info("GPU %d (%s): fault cleared; held until its remediation steps pass",
                     fault.gpu_index, uuid)  # fmt: skip

    def pending_validation(self) -> list[tuple[int, str, str]]:
        """GPUs held for validation: (index, UUID, reason)."""
        with self._lock:
            return sorted(
                (f.gpu_index, uuid, f.reason)
                for (uuid, _, key), f in self._faults.items()
                if key == VALIDATION_KEY
            )

    def finish_validation(
        self, uuid: str, passed: bool, detail: str, *, retry_s: float | None = None
    ) -> None:
        """Release a held GPU (``passed``), or keep it held with ``detail`` as the reason.

        ``retry_s``: when the steps run again after a failure (shown in the GPU's action).
        """
        now = self._clock()
        with self._lock:
            fault = self._faults.get((uuid, None, VALIDATION_KEY))
            if fault is None:
                return
            if passed:
                del self._faults[(uuid, None, VALIDATION_KEY)]
                self._validation_retry_s.pop(uuid, None)
            else:
                fault.reason = f"validation failed: {detail}"
                fault.last_s = now
                if retry_s is not None:
                    self._validation_retry_s[uuid] = retry_s
            self.dirty = True
            changes = self._recompute(now)
        self._deliver(changes)

    # --- inputs --------------------------------------------------------------------------------
    def on_event(self, event: GpuEvent) -> None:
        """Apply one NVML event at once."""
        now = self._clock()
        with self._lock:
            self._events[event.kind.value] += 1
            self._know_gpu(event.gpu_index, event.gpu_uuid)
            obs = self._event_observation(event, now)
            if obs is not None:
                self._observe(obs, now)
            changes = self._recompute(now)
        self._deliver(changes)

    def on_snapshot(self, snapshot: NodeSnapshot) -> None:
        """Run the snapshot checks, refresh the device list and expire quiet faults."""
        now = self._clock()
        snapshot = self._known_identities(snapshot)
        observations = self.checks.run(snapshot, now)
        with self._lock:
            self.snapshots_seen += 1
            self._driver_version = snapshot.driver_version
            current: dict[str, _Gpu] = {}
            for gpu in snapshot.gpus:
                if not gpu.info.uuid:
                    continue
                entry = _Gpu(gpu.info.index, gpu.info.uuid)
                for gi in gpu.mig_instances:
                    for ci in gi.compute_instances:
                        entry.mig[ci.uuid] = gi.instance_id
                current[gpu.info.uuid] = entry
            # GPUs only known from restored faults stay until those faults expire.
            for uuid, known in self._gpus.items():
                if uuid not in current and any(k[0] == uuid for k in self._faults):
                    current[uuid] = known
            self._gpus = current
            for obs in observations:
                self._observe(obs, now)
            # The first full sample has spoken: a carried fault it saw again goes on as the
            # same incident; one it did not see now expires by its hold like any other.
            self._carried.clear()
            changes = self._recompute(now)
            behind, self._behind = self._behind, False
        if behind:
            self.save()
        self._deliver(changes)

    def _known_identities(self, snapshot: NodeSnapshot) -> NodeSnapshot:
        """Give a GPU lost before this process could read its UUID the UUID the history knew.

        Without it, a GPU lost across a restart would be a new device (a stand-in ID, a second
        incident) while its real one, no longer observed, came back healthy.
        """
        with self._lock:
            known = {g.index: g.uuid for g in self._gpus.values()}
        if not known or not any(g.info.uuid == unknown_gpu_id(g.info.index) for g in snapshot.gpus):
            return snapshot
        gpus = tuple(
            replace(g, info=replace(g.info, uuid=known[g.info.index]))
            if g.info.uuid == unknown_gpu_id(g.info.index) and g.info.index in known
            else g
            for g in snapshot.gpus
        )
        return replace(snapshot, gpus=gpus)

    def tick(self) -> None:
        """Expire faults whose hold time passed (called periodically by the component)."""
        now = self._clock()
        with self._lock:
            changes = self._recompute(now)
        self._deliver(changes)

    # --- outputs -------------------------------------------------------------------------------
    def node_health(self) -> NodeHealth:
        """A consistent view of the node for reporting."""
        now = self._clock()
        with self._lock:
            level = self.score.level(now)
            if not self._known_at_start and self.snapshots_seen == 0:
                level = StabilityLevel.UNKNOWN
            devices = sorted(
                self._health.values(), key=lambda d: (d.gpu_index, d.uuid not in self._gpus, d.uuid)
            )
            parent = {m: g.uuid for g in self._gpus.values() for m in g.mig}
            return NodeHealth(
                timestamp_s=now,
                level=level,
                score=self.score.score(now),
                flapping=self.score.flapping,
                transitions_in_window=self.score.transitions_in_window(now),
                devices=tuple(devices),
                mig_parent=parent,
                driver_version=self._driver_version,
                events_total=dict(self._events),
                xids_total=dict(self._xids),
                xid_last_s=dict(self._xid_last),
                history_errors=self.history_errors,
            )

    def faults(self) -> list[Fault]:
        """Copies of the active faults."""
        with self._lock:
            return [replace(f) for f in self._faults.values()]

    def save(self, *, final: bool = False) -> None:
        """Write the history (score, flapping, active faults) atomically, if it changed.

        ``final`` (at shutdown) also writes last-seen times that moved less than
        :data:`HISTORY_REFRESH_S` since the previous write.
        """
        if self.history_path is None or self.read_only:
            return
        with self._lock:
            moved = any(f.last_s != f.saved_last_s for f in self._faults.values())
            if not self.dirty and not (final and moved):
                return
            history = SavedHistory(
                version=HISTORY_VERSION,
                score=self.score.saved(),
                faults=tuple(self._faults.values()),
            )
            data = {
                "saved_s": self._clock(),
                **_HISTORY.dump_python(history, mode="json", by_alias=True),
            }
            self.dirty = False
            for fault in self._faults.values():
                fault.saved_last_s = fault.last_s
        try:
            write_json_atomic(self.history_path, data)
        except StateFileError as exc:
            with self._lock:
                self.dirty = True  # try again at the next report: the faults must reach disk
            self.write_faults.failed(exc)
        else:
            self.write_faults.succeeded(self.history_path)

    # --- internals -----------------------------------------------------------------------------
    def _restore(self, path: Path) -> None:
        """Take the score and the active faults from the history file (see the module doc)."""
        try:
            history = read_json_as(path, _HISTORY)
        except (OSError, ValueError) as exc:
            self._set_aside(path, exc)
            self._restore_published()
            return
        if history is None:
            self._restore_published()  # no history (first start, or it was removed)
            return
        self.score.restore(history.score)
        now = self._clock()
        faults = [replace(f) for f in history.faults]  # the model's own, mutable copies
        for fault in faults:
            # What the file holds; the next sighting refreshes it by the usual rule.
            fault.saved_last_s = fault.last_s
            # The saved last-seen time lags the truth by up to RESTORE_SLACK_S: on doubt, hold.
            fault.last_s = max(fault.last_s, min(fault.last_s + RESTORE_SLACK_S, now))
            self._carry(fault)
        self._known_at_start = True
        if faults:
            log.info("restored %d active fault(s) from %s", len(faults), path)
        self._recompute(now, count_transitions=False)

    def _carry(self, fault: Fault) -> None:
        key = (fault.gpu_uuid, fault.gpu_instance_id, fault.key)
        self._faults[key] = fault
        self._carried.add(key)
        self._know_gpu(fault.gpu_index, fault.gpu_uuid)

    def _set_aside(self, path: Path, why: Exception) -> None:
        """Keep an unusable history for inspection, say so, count it."""
        self.history_errors += 1
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self._clock()))
        aside = path.with_name(f"{path.name}{UNUSABLE_SUFFIX}{stamp}")
        if self.read_only:
            log.error("health history %s is unusable (%s); the agent sets it aside", path, why)
            return
        try:
            path.rename(aside)
            kept = f"moved to {aside}"
        except OSError as exc:
            kept = f"could not move it aside: {exc.strerror}"
        log.error("health history %s is unusable (%s); %s", path, why, kept)

    def _restore_published(self) -> None:
        """Start from the status the agent last published; unknown until sampled without one.

        The published score becomes one record at the status's time (so it decays as the lost
        history would have), its level the score's level, and every GPU it showed unhealthy a
        carried fault held for the quiet period.
        """
        path = self.status_path
        if path is None:
            return
        try:
            published = read_json_as(path, _PUBLISHED)
        except (OSError, ValueError) as exc:
            log.error("cannot start from the published health status %s: %s", path, exc)
            return
        if published is None:
            return
        level, score = published.stability.level, published.stability.score
        if score > 0:
            self.score.record(
                FaultRecord(published.timestamp_s, score, -1, "published before a restart")
            )
        self.score.score_level = level
        for d in published.devices:
            if d.parent is not None or d.state is HealthState.HEALTHY:
                continue
            fault = Fault(
                d.gpu,
                d.uuid,
                None,
                PUBLISHED_KEY,
                d.state,
                "; ".join(d.reasons) or d.state.value,
                d.action,
                d.since_s,
                published.timestamp_s,
                self.config.recovery_quiet_s,
            )
            self._carry(fault)
        self._known_at_start = True
        log.warning("health restored from the published status %s (level %s)", path, level)
        self._recompute(self._clock(), count_transitions=False)

    def _know_gpu(self, index: int, uuid: str) -> None:
        if uuid and uuid not in self._gpus:
            self._gpus[uuid] = _Gpu(index, uuid)

    def _event_observation(self, event: GpuEvent, now: float) -> Observation | None:
        uuid = event.gpu_uuid
        if event.kind is EventKind.XID:
            code = event.data
            self._xids[(uuid, code)] += 1
            self._xid_last[(uuid, code)] = now
            info = self.policy.lookup(code)
            if info is None:
                return None
            fatal = info.action.rank >= Action.RESET_GPU.rank
            gi = None if self.policy.scope_is_gpu(info) else event.gpu_instance_id
            where = f" on MIG instance {gi}" if gi is not None else ""
            return Observation(
                event.gpu_index,
                uuid,
                f"xid:{code}",
                info.state,
                f"xid {code}{where}: {info.meaning}",
                info.action,
                fatal,
                gi,
            )
        if event.kind is EventKind.ECC_DOUBLE_BIT:
            return Observation(
                event.gpu_index,
                uuid,
                "ecc-dbe",
                HealthState.UNHEALTHY,
                "uncorrectable ECC error",
                Action.RESET_GPU,
                fatal=True,
            )
        count = self.checks.note_sbe_event(uuid, now)
        if count >= self.config.ecc_sbe_threshold:
            return Observation(
                event.gpu_index,
                uuid,
                "ecc-sbe-rate",
                HealthState.DEGRADED,
                f"{count} corrected ECC errors in {self.config.sbe_window_s:g}s",
                Action.NONE,
            )
        return None

    def _observe(self, obs: Observation, now: float) -> None:
        key = (obs.gpu_uuid, obs.gpu_instance_id, obs.key)
        fault = self._faults.get(key)
        hold = self.config.fatal_hold_s if obs.fatal else self.config.recovery_quiet_s
        if fault is None:
            # One incident often shows up as several faults at once (XID 79 and the lost GPU;
            # a DBE event, XID 48 and a pending remap): the score counts the incident by its
            # worst fault, so a new fault adds only what it exceeds the GPU's active ones by.
            weight = fault_weight(obs.state, obs.action)
            active = (
                fault_weight(f.state, f.action)
                for (uuid, gi, _), f in self._faults.items()
                if uuid == obs.gpu_uuid and gi in (None, obs.gpu_instance_id)
            )
            weight = max(weight - max(active, default=0.0), 0.0)
            if obs.key in NODE_WIDE_KEYS and any(k[2] == obs.key for k in self._faults):
                weight = 0.0  # the host's condition, already counted on another GPU
            self._faults[key] = Fault(
                obs.gpu_index,
                obs.gpu_uuid,
                obs.gpu_instance_id,
                obs.key,
                obs.state,
                obs.reason,
                obs.action,
                now,
                now,
                hold,
            )
            self.score.record(FaultRecord(now, weight, obs.gpu_index, obs.reason))
            self.dirty = True
            return
        fault.last_s = now
        if now - fault.saved_last_s >= HISTORY_REFRESH_S:
            self.dirty = True  # the hold counts from here: the history must know it
        if now - fault.saved_last_s > RESTORE_SLACK_S:
            # Seen again after a gap (first sight after a restart): the file is further behind
            # than a restore allows for, so it is written before this sample is done, not at
            # the reporter's next pass, which a crash right now would never reach.
            self._behind = True
        fault.count += 1
        fault.reason = obs.reason
        fault.hold_s = max(fault.hold_s, hold)
        if severity(obs.state) > severity(fault.state):
            fault.state = obs.state
        fault.action = strongest((fault.action, obs.action))

    def _recompute(
        self, now: float, *, count_transitions: bool = True
    ) -> list[tuple[HealthTransition | None, bool]]:
        """Expire faults and rebuild device health; returns (transition, changed) pairs."""
        expired = [k for k, f in self._faults.items() if f.expired(now) and k not in self._carried]
        gone = {k: self._faults.pop(k) for k in expired}
        if expired:
            self.dirty = True
        if self.validation_hold:
            self._hold_for_validation(gone, now)
        by_scope: dict[tuple[str, int | None], list[Fault]] = {}
        for (uuid, gi, _), fault in self._faults.items():
            by_scope.setdefault((uuid, gi), []).append(fault)
        fresh: dict[str, DeviceHealth] = {}
        for gpu in self._gpus.values():
            gpu_faults = by_scope.get((gpu.uuid, None), [])
            fresh[gpu.uuid] = self._device(gpu.uuid, gpu.index, gpu_faults, now)
            for mig_uuid, gi in gpu.mig.items():
                faults = gpu_faults + by_scope.get((gpu.uuid, gi), [])
                fresh[mig_uuid] = self._device(mig_uuid, gpu.index, faults, now)
        out: list[tuple[HealthTransition | None, bool]] = []
        flapped: set[int] = set()
        keys: dict[int, set[str]] = {}
        for uuid, _, key in self._faults:
            if uuid in self._gpus:
                keys.setdefault(self._gpus[uuid].index, set()).add(key)
        for uuid, health in fresh.items():
            old = self._health.get(uuid)
            if old is None:
                if health.state is not HealthState.HEALTHY:
                    out.append((HealthTransition(HealthState.HEALTHY, health), True))
                else:
                    out.append((None, True))
                continue
            if old.state is not health.state:
                out.append((HealthTransition(old.state, health), True))
                flapped.add(health.gpu_index)
            elif old.reasons != health.reasons or old.action != health.action:
                out.append((None, True))
            else:
                fresh[uuid] = old  # keep since_s
        if len(fresh) != len(self._health):
            out.append((None, True))
        if count_transitions:
            # One per physical GPU, however many MIG devices it has; a host condition that
            # came or went on every GPU at once (driver drift) is one change of the node.
            before = self._keys
            host = {i for i in flapped if _host_only(keys.get(i, set()) ^ before.get(i, set()))}
            for _ in range(len(flapped - host) + (1 if host else 0)):
                self.score.transition(now)
                self.dirty = True
            self._log_transitions([t for t, _ in out if t is not None])
        self._keys = keys
        self._health = fresh
        return out

    def _log_transitions(self, transitions: list[HealthTransition]) -> None:
        """One line per GPU that changed state; its MIG devices that followed it are counted.

        A MIG device that changed on its own (a fault of its GPU instance) gets its own line.
        """
        parent = {m: g.uuid for g in self._gpus.values() for m in g.mig}
        by_uuid = {t.current.uuid: t for t in transitions}
        followed: Counter[str] = Counter()
        for t in transitions:
            gpu = parent.get(t.current.uuid)
            if gpu is not None and gpu in by_uuid and _same(by_uuid[gpu], t):
                followed[gpu] += 1
        for t in transitions:
            cur = t.current
            gpu = parent.get(cur.uuid)
            if gpu is not None and gpu in by_uuid and _same(by_uuid[gpu], t):
                continue
            where = f"GPU {cur.gpu_index} ({cur.uuid})"
            if gpu is not None:
                where = f"GPU {cur.gpu_index} MIG device {cur.uuid}"
            elif followed[cur.uuid]:
                where += f" and its {followed[cur.uuid]} MIG device(s)"
            worse = severity(cur.state) > severity(t.previous)
            why = "; ".join(cur.reasons) if cur.reasons else "condition cleared and stayed quiet"
            log.log(
                logging.WARNING if worse else logging.INFO,
                "%s: %s -> %s: %s; action: %s",
                where,
                t.previous.value,
                cur.state.value,
                _bounded(why),
                cur.action,
            )

    def _device(self, uuid: str, index: int, faults: list[Fault], now: float) -> DeviceHealth:
        old = self._health.get(uuid)
        if not faults:
            state = HealthState.HEALTHY
            reasons: tuple[str, ...] = ()
            action = Action.NONE
        else:
            ordered = sorted(faults, key=lambda f: (-severity(f.state), f.key))
            state = ordered[0].state
            reasons = tuple(f.reason for f in ordered)
            action = strongest(f.action for f in faults)
        if old is not None and old.state is state:
            since = old.since_s
        elif faults and state is not HealthState.HEALTHY:
            since = min(f.first_s for f in faults if f.state is state)
        else:
            since = now
        text = action.value
        held = next((f for f in faults if f.key == VALIDATION_KEY), None)
        if action is Action.NONE and held is not None:
            text = self._validation_action(held)
        return DeviceHealth(uuid, index, state, reasons, text, since)

    def _validation_action(self, held: Fault) -> str:
        """What happens next to a GPU held for validation, and what the operator can do."""
        if not held.reason.startswith("validation failed"):
            return VALIDATION_WAIT_ACTION
        retry = self._validation_retry_s.get(held.gpu_uuid)
        # Restored after a restart, the retry interval is the pool's, not remembered here.
        every = f"every {retry:g}s" if retry is not None else "after remediation.retry_s"
        return f"{VALIDATION_RETRY_ACTION} {every}"

    @property
    def known(self) -> bool:
        """Whether the node's health is known (restored at start, or sampled once)."""
        with self._lock:
            return self._known_at_start or self.snapshots_seen > 0

    def _deliver(self, changes: list[tuple[HealthTransition | None, bool]]) -> None:
        if not changes:
            return
        subscribers = self._subscribers.current()
        with self._deliver_lock:
            for transition, _ in changes:
                if transition is not None:
                    self._subscribers.notify(transition, subscribers)
            self._listeners.notify(None)


def _host_only(changed: set[str]) -> bool:
    """Whether a GPU's fault keys changed only by host conditions (and changed at all)."""
    return bool(changed) and changed <= NODE_WIDE_KEYS


def _same(a: HealthTransition, b: HealthTransition) -> bool:
    return (a.previous, a.current.state, a.current.reasons) == (
        b.previous,
        b.current.state,
        b.current.reasons,
    )


def _bounded(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
