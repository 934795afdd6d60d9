"""Pool policy acting on sustained interference: cap replicas, go exclusive, dry run."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nodeagent.config.pool_policy import SharingMode
from nodeagent.config.schema import AgentConfig
from nodeagent.gpu.node import GpuNode
from nodeagent.runtime.component import Idle
from nodeagent.runtime.snapshots import SnapshotStore
from nodeagent.sharing.actions import SharingActions
from nodeagent.sharing.component import build
from nodeagent.sim.control import SimControl
from nodeagent.testing.clock import FakeClock
from nodeagent.workloads import CgroupReader, PodIndex, attribute, shared_devices
from tests.device_plugin.conftest import make_config


class Plugin:
    """Stands in for the device plugin's reload hook: records the configs it is handed."""

    def __init__(self) -> None:
        self.configs: list[AgentConfig] = []

    def reload(self, config: AgentConfig) -> None:
        self.configs.append(config)


@dataclass
class Measured:
    """Stands in for the exporter's renderer: no GPU shared yet."""

    shared: tuple[()] = ()


def _uid(i: int) -> str:
    return f"{i:08x}-0000-0000-0000-000000000000"


@dataclass(frozen=True)
class Case:
    actions: dict[str, Any]
    sharing: dict[str, Any]
    shares: tuple[float, ...]  # pods on GPU 0; (0.9, 0.3) saturates and starves the second
    advance_s: float
    expected: tuple[str, int] | None  # (mode, replicas) handed to the plugin; None: no reload
    logged: int  # decisions in the log


TS4 = {"mode": "time-slicing", "replicas": 4}
ON = {"enabled": True, "for_s": 600}
CASES = [
    pytest.param(Case(ON, TS4, (0.9, 0.3), 601, ("time-slicing", 2), 1), id="cap-replicas"),
    pytest.param(
        Case({**ON, "action": "exclusive"}, TS4, (0.9, 0.3), 601, ("exclusive", 1), 1),
        id="exclusive",
    ),
    pytest.param(Case({**ON, "dry_run": True}, TS4, (0.9, 0.3), 601, None, 1), id="dry-run"),
    pytest.param(Case(ON, TS4, (0.9, 0.3), 300, None, 0), id="not-sustained-yet"),
    pytest.param(Case(ON, TS4, (0.2, 0.3), 601, None, 0), id="quiet"),
    pytest.param(Case({"enabled": False}, TS4, (0.9, 0.3), 601, None, 0), id="off-by-default"),
    pytest.param(
        Case({**ON, "cap_replicas": 4}, TS4, (0.9, 0.3), 601, None, 0), id="already-at-cap"
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_sharing_actions(
    case: Case, make_node: Callable[..., GpuNode], sim_state_dir: Path, tmp_path: Path
) -> None:
    node = make_node("dgx-h100")
    control = SimControl(sim_state_dir)
    for i, share in enumerate(case.shares):
        pid = control.add_process(0, load=share)
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(f"0::/kubepods/pod{_uid(i)}/{f'{i:x}' * 64}\n")
    index = PodIndex({_uid(i): ("team", f"pod-{i}") for i in range(len(case.shares))})
    reader = CgroupReader(tmp_path)

    def shared():
        snapshot = node.snapshot()
        return shared_devices(snapshot, attribute(snapshot, [], reader, index))

    config = make_config(
        {"pools": {"default": {"sharing": case.sharing, "sharing_actions": case.actions}}}
    )
    clock = FakeClock()
    plugin = Plugin()
    actions = SharingActions(config, SnapshotStore(), shared, plugin, clock=clock)
    actions.evaluate()
    clock.advance(case.advance_s)
    actions.evaluate()
    assert len(actions.log) == case.logged
    if case.expected is None:
        assert plugin.configs == []
        return
    (handed,) = plugin.configs
    uuid = node.info(0).uuid
    after = handed.pool.sharing_for(0, uuid)
    assert (after.mode.value, after.replicas) == case.expected
    # Only that GPU changes; the others keep the pool's sharing.
    other = handed.pool.sharing_for(1, node.info(1).uuid)
    assert (other.mode, other.replicas) == (SharingMode.TIME_SLICING, 4)
    assert "interference" in actions.log[0].reason
    actions.evaluate()
    assert len(plugin.configs) == 1, "acted once"
    actions.reload(config)  # SIGHUP: the file's policy wins again, the clock starts over
    actions.evaluate()
    assert len(plugin.configs) == 1


def test_the_feature_is_idle_when_the_pool_turns_it_off_or_nothing_measures() -> None:
    on = make_config({"pools": {"default": {"sharing_actions": {"enabled": True}}}})
    off = make_config({})
    plugin = Plugin()
    measured = Measured()
    assert isinstance(build(on, SnapshotStore(), plugin, measured=measured), SharingActions)
    for config, source in ((off, measured), (on, None)):
        idle = build(config, SnapshotStore(), plugin, measured=source)
        assert isinstance(idle, Idle)
        assert idle.name == SharingActions.name
        assert idle.ready
        # It runs like any component: until stop, and not a moment past it.
        stop = threading.Event()
        runner = threading.Thread(target=idle.run, args=(stop,))
        runner.start()
        runner.join(0.05)
        assert runner.is_alive(), "an idle component returned before stop (a crash)"
        stop.set()
        runner.join(5)
        assert not runner.is_alive()
