"""Fixtures for health tests: a simulated node, its control API and a model on a fake clock."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nodeagent.config.health import HealthSection
from nodeagent.gpu.errors import GpuLost
from nodeagent.gpu.node import EventWatcher, GpuNode
from nodeagent.health.model import HealthModel
from nodeagent.runtime.health_source import HealthTransition
from nodeagent.sim.control import SimControl
from nodeagent.testing.clock import FakeClock


@dataclasses.dataclass
class Rig:
    """A simulated node wired to a health model, driven by hand."""

    node: GpuNode
    control: SimControl
    model: HealthModel
    watcher: EventWatcher
    clock: FakeClock
    transitions: list[HealthTransition]
    uuids: list[str]

    def pump(self) -> None:
        """Feed every queued event, then one snapshot, to the model (as the agent would)."""
        while True:
            try:
                event = self.watcher.wait(0.0)
            except GpuLost:
                continue  # as the agent's event thread does: the snapshot reports it
            if event is None:
                break
            self.model.on_event(event)
        self.model.on_snapshot(self.node.snapshot())

    def gpu(self, index: int) -> Any:
        return self.model.device_health()[self.uuids[index]]


MakeRig = Callable[..., Rig]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_rig(
    make_node: Callable[..., GpuNode], sim_state_dir: Path, clock: FakeClock
) -> Iterator[MakeRig]:
    """``make_rig("dgx-h100", recovery_quiet_s=60, history=path, expected_driver="570.1")``."""
    watchers: list[EventWatcher] = []

    def make(preset: str, history: Path | None = None, **config: Any) -> Rig:
        node = make_node(preset)
        control = SimControl(sim_state_dir, preset)
        expected = config.pop("expected_driver", None)  # the pool's, not a health field
        cfg = HealthSection(**config)
        model = HealthModel(cfg, expected_driver=expected, history_path=history, clock=clock)
        transitions: list[HealthTransition] = []
        model.subscribe(transitions.append)
        watcher = node.watch_events()
        watchers.append(watcher)
        uuids = [info.uuid for info in node.inventory()]
        rig = Rig(node, control, model, watcher, clock, transitions, uuids)
        rig.pump()
        return rig

    yield make
    for watcher in watchers:
        watcher.close()
