"""The health model: per-device state from events and snapshot checks, and the node score.

Every condition is a *fault* on a scope: a whole GPU (by UUID) or one MIG GPU instance of it.
A fault stays active while it is observed and for a hold time after it was last seen: the quiet
period (``health.recovery_quiet_s``) for conditions, and ``health.fatal_hold_s`` for events that
need a reset or worse (an XID leaves no readable "cleared" flag behind). A device's state is the
worst of the faults that apply to it: a GPU sees its own faults; a MIG device sees its GPU's
faults plus those of its GPU instance.

Transitions are delivered synchronously on the thread that caused them (the event thread for
XIDs, the sampler thread for snapshot checks), so the device plugin hears of an XID within the
time it takes to run the callbacks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from nodeagent.atomicfile import write_json_atomic
from nodeagent.config.health import HealthSection
from nodeagent.gpu.types import EventKind, GpuEvent, NodeSnapshot
from nodeagent.health.checks import Observation, SnapshotChecks
from nodeagent.health.score import (
    HISTORY_VERSION,
    FaultRecord,
    StabilityLevel,
    StabilityScore,
    read_json,
)
from nodeagent.health.xids import Action, XidPolicy, strongest
from nodeagent.runtime.health import DeviceHealth, HealthState, HealthTransition
from nodeagent.runtime.subscribers import Subscribers

log = logging.getLogger(__name__)

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
    """An active condition on one scope."""

    gpu_index: int
    gpu_uuid: str
    gpu_instance_id: int | None
    key: str
    state: HealthState
    reason: str
    action: Action
    first_s: float
    last_s: float
    hold_s: float
    count: int = 1

    def expired(self, now_s: float) -> bool:
        """Whether the condition has been quiet for its whole hold time."""
        return now_s - self.last_s >= self.hold_s

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form (for the history file)."""
        return {
            "gpu": self.gpu_index,
            "uuid": self.gpu_uuid,
            "gi": self.gpu_instance_id,
            "key": self.key,
            "state": self.state.value,
            "reason": self.reason,
            "action": self.action.value,
            "first": self.first_s,
            "last": self.last_s,
            "hold": self.hold_s,
            "count": self.count,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Fault:
        """Inverse of :meth:`to_json`."""
        gi = d.get("gi")
        return cls(
            int(d["gpu"]),
            str(d["uuid"]),
            None if gi is None else int(gi),
            str(d["key"]),
            HealthState(d["state"]),
            str(d["reason"]),
            Action(d["action"]),
            float(d["first"]),
            float(d["last"]),
            float(d["hold"]),
            int(d.get("count", 1)),
        )


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

    @property
    def worst(self) -> HealthState:
        """The worst state of any device (healthy with no devices)."""
        return max((d.state for d in self.devices), key=severity, default=HealthState.HEALTHY)


class HealthModel:
    """Implements :class:`~nodeagent.runtime.health.HealthSource` over events and snapshots."""

    def __init__(
        self,
        config: HealthSection,
        *,
        expected_driver: str | None = None,
        history_path: Path | None = None,
        clock: Clock = time.time,
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
            changes = self._recompute(now)
        self._deliver(changes)

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
            )

    def faults(self) -> list[Fault]:
        """Copies of the active faults."""
        with self._lock:
            return [replace(f) for f in self._faults.values()]

    def save(self) -> None:
        """Write the history (score, flapping, active faults) atomically, if it changed."""
        if self.history_path is None:
            return
        with self._lock:
            if not self.dirty:
                return
            data = {
                "version": HISTORY_VERSION,
                "saved_s": self._clock(),
                "score": self.score.to_json(),
                "faults": [f.to_json() for f in self._faults.values()],
            }
            self.dirty = False
        write_json_atomic(self.history_path, data)

    # --- internals -----------------------------------------------------------------------------
    def _restore(self, path: Path) -> None:
        try:
            data = read_json(path)
        except ValueError as exc:
            # A corrupt history must not keep the agent from starting; say so loudly.
            log.error("ignoring health history: %s", exc)
            return
        if not isinstance(data, dict) or data.get("version") != HISTORY_VERSION:
            if data is not None:
                log.error("ignoring health history %s: unknown version", path)
            return
        self.score.load_json(data.get("score", {}))
        now = self._clock()
        for raw in data.get("faults", []):
            fault = Fault.from_json(raw)
            if not fault.expired(now):
                # Fail closed: a fault active when the agent stopped stays until its hold ends.
                self._faults[(fault.gpu_uuid, fault.gpu_instance_id, fault.key)] = fault
                self._know_gpu(fault.gpu_index, fault.gpu_uuid)
        self._recompute(now, count_transitions=False)

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
        expired = [k for k, f in self._faults.items() if f.expired(now)]
        for k in expired:
            del self._faults[k]
        if expired:
            self.dirty = True
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
            for _ in flapped:  # one per physical GPU, however many MIG devices it has
                self.score.transition(now)
                self.dirty = True
        self._health = fresh
        return out

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
        return DeviceHealth(uuid, index, state, reasons, action.value, since)

    def _deliver(self, changes: list[tuple[HealthTransition | None, bool]]) -> None:
        if not changes:
            return
        subscribers = self._subscribers.current()
        with self._deliver_lock:
            for transition, _ in changes:
                if transition is not None:
                    self._subscribers.notify(transition, subscribers)
            self._listeners.notify(None)
