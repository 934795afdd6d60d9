"""Pool policy acting on interference: cap a noisy shared GPU's replicas or make it exclusive.

With ``pools.<pool>.sharing_actions.enabled``, a whole GPU shared by time-slicing or MPS whose
interference ratio (or memory pressure) stays at or above the pool's threshold for ``for_s``
gets a per-GPU sharing override: its replicas capped at ``cap_replicas``, or mode exclusive.
The device plugin takes it as a config reload: pods that hold replicas keep running, new pods
see fewer replicas. An override stays until the agent restarts or its config is reloaded
(SIGHUP: the file's policy is back, and the clock starts again). With ``dry_run`` the action
is only logged ("would ..."). Every decision is logged and kept in :attr:`SharingActions.log`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field

from nodeagent.config.pool_policy import Sharing, SharingMode
from nodeagent.config.schema import AgentConfig
from nodeagent.runtime.component import Reloadable
from nodeagent.runtime.snapshots import SnapshotFeed
from nodeagent.workloads import SharedDevice

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SharingAction:
    """One decision: what changed (or would have) on which GPU, and why."""

    gpu_index: int
    gpu_uuid: str
    before: Sharing
    after: Sharing
    reason: str
    dry_run: bool


@dataclass(eq=False)
class SharingActions:
    """Watches the shared GPUs of each observed snapshot and applies the pool's sharing actions."""

    name = "sharing-actions"

    config: AgentConfig
    snapshots: SnapshotFeed
    shared: Callable[[], Sequence[SharedDevice]]
    plugin: Reloadable | None
    _: KW_ONLY
    clock: Callable[[], float] = time.monotonic
    _noisy_since: dict[str, float] = field(default_factory=dict, init=False)
    _overrides: dict[str, Sharing] = field(default_factory=dict, init=False)
    _acted: set[str] = field(default_factory=set, init=False)
    log: list[SharingAction] = field(default_factory=list, init=False)

    @property
    def ready(self) -> bool:
        """Always: it only watches."""
        return True

    def reload(self, config: AgentConfig) -> None:
        """A new config: its policy wins again, overrides and clocks start over."""
        self.config = config
        self._noisy_since.clear()
        self._overrides.clear()
        self._acted.clear()

    def evaluate(self) -> list[SharingAction]:
        """One look at the shared GPUs; returns the actions decided now."""
        policy = self.config.pool.sharing_actions
        if not policy.enabled:
            return []
        now = self.clock()
        noisy_now: set[str] = set()
        decided: list[SharingAction] = []
        for d in self.shared():
            if d.device.mig_uuid is not None or d.device.mig_profile is not None:
                continue  # a MIG device's sharing follows its GPU's; not acted on alone
            uuid = d.device.gpu_uuid
            why = []
            if d.interference_ratio >= policy.interference_threshold:
                why.append(f"interference {d.interference_ratio:.2f}")
            if (d.memory_pressure_ratio or 0.0) >= policy.memory_pressure_threshold:
                why.append(f"memory pressure {d.memory_pressure_ratio:.2f}")
            if not why:
                continue
            noisy_now.add(uuid)
            since = self._noisy_since.setdefault(uuid, now)
            if now - since < policy.for_s or uuid in self._acted:
                continue
            before = self._overrides.get(uuid) or self.config.pool.sharing_for(
                d.device.gpu_index, uuid
            )
            if before.mode is SharingMode.EXCLUSIVE:
                continue
            if policy.action == "exclusive":
                after = Sharing(mode=SharingMode.EXCLUSIVE)
            else:
                if before.replicas <= policy.cap_replicas:
                    continue
                after = before.model_copy(update={"replicas": policy.cap_replicas})
            reason = f"{', '.join(why)} for {now - since:.0f}s with {len(d.workloads)} workloads"
            action = SharingAction(d.device.gpu_index, uuid, before, after, reason, policy.dry_run)
            self._acted.add(uuid)
            self.log.append(action)
            decided.append(action)
            change = (
                f"{before.mode.value} x{before.replicas} -> {after.mode.value} x{after.replicas}"
            )
            if policy.dry_run:
                log.info("sharing actions (dry run): would change GPU %d (%s): %s (%s)",
                         d.device.gpu_index, uuid, change, reason)  # fmt: skip
                continue
            log.warning("sharing actions: GPU %d (%s): %s (%s)", d.device.gpu_index, uuid,
                        change, reason)  # fmt: skip
            self._overrides[uuid] = after
        for uuid in [u for u in self._noisy_since if u not in noisy_now]:
            del self._noisy_since[uuid]  # quiet again: the clock starts over
        if any(not a.dry_run for a in decided) and self.plugin is not None:
            self.plugin.reload(self._with_overrides())
        return decided

    def _with_overrides(self) -> AgentConfig:
        pool = self.config.pool
        gpu_sharing = {**pool.gpu_sharing, **self._overrides}
        pools = {
            **self.config.pools,
            self.config.node.pool: pool.model_copy(update={"gpu_sharing": gpu_sharing}),
        }
        return self.config.model_copy(update={"pools": pools})

    def run(self, stop: threading.Event) -> None:
        """Evaluate after each new snapshot until ``stop``."""
        generation = self.snapshots.generation
        while not stop.is_set():
            if self.snapshots.wait_newer(generation, 1.0) is None:
                continue
            generation = self.snapshots.generation
            # The exporter observes the snapshot (attribution, interference) on its own thread;
            # a short wait lets that finish (a late one is taken at the next snapshot).
            stop.wait(0.05)
            self.evaluate()
