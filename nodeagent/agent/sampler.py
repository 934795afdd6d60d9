"""The sampler: reads NVML at a fixed interval into one immutable NodeSnapshot."""

from __future__ import annotations

import logging
import threading
import time

from nodeagent.config.schema import AgentConfig, SamplerSection
from nodeagent.gpu.protocols import SnapshotSource
from nodeagent.runtime.snapshots import SnapshotStore

log = logging.getLogger(__name__)


class Sampler:
    """Publishes ``node.snapshot()`` every ``interval_s`` seconds.

    Sampling is paced on a monotonic schedule (start + k * interval), so a slow pass shortens the
    next wait instead of drifting; a pass that overruns a whole interval skips ahead.
    """

    name = "sampler"

    def __init__(self, node: SnapshotSource, store: SnapshotStore, config: SamplerSection) -> None:
        self._node = node
        self._store = store
        self.interval_s = config.interval_s
        node.nvlink_counters_interval_s = config.nvlink_counters_interval_s
        node.profiling_enabled = config.profiling
        node.profiling_interval_s = config.profiling_interval_s
        self._ready = threading.Event()

    def reload(self, config: AgentConfig) -> None:
        """Take a new pace (SIGHUP); the next wait already uses it."""
        self.interval_s = config.sampler.interval_s
        self._node.nvlink_counters_interval_s = config.sampler.nvlink_counters_interval_s
        self._node.profiling_enabled = config.sampler.profiling
        self._node.profiling_interval_s = config.sampler.profiling_interval_s

    @property
    def ready(self) -> bool:
        """True once the first snapshot is published."""
        return self._ready.is_set()

    def sample_once(self) -> None:
        """Take and publish one snapshot."""
        self._store.publish(self._node.snapshot())
        self._ready.set()

    def run(self, stop: threading.Event) -> None:
        """Sample until ``stop`` is set."""
        next_due = time.monotonic()
        while not stop.is_set():
            self.sample_once()
            next_due += self.interval_s
            now = time.monotonic()
            if next_due < now:
                log.warning("sampling took longer than the %.2fs interval", self.interval_s)
                next_due = now
            stop.wait(next_due - now)
