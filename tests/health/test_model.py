"""The health model: recovery, holds, operator overrides, MIG scope, score and persistence.

Every signal -> state, reason and action is in test_signals.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nodeagent.gpu.types import Placement
from nodeagent.health.model import HealthModel
from nodeagent.health.score import StabilityLevel
from nodeagent.runtime.health_source import HealthState
from tests.health.conftest import MakeRig

H = HealthState


def test_recovery_only_after_the_quiet_period(make_rig: MakeRig) -> None:
    rig = make_rig("dgx-h100", recovery_quiet_s=120)
    rig.control.inject("thermal", 0)
    rig.pump()
    assert rig.gpu(0).state is H.DEGRADED
    rig.control.clear(0)
    rig.clock.advance(60)
    rig.pump()
    assert rig.gpu(0).state is H.DEGRADED  # cleared, but not quiet long enough
    rig.clock.advance(61)
    rig.pump()
    assert rig.gpu(0).state is H.HEALTHY
    assert [(t.previous, t.current.state) for t in rig.transitions] == [
        (H.HEALTHY, H.DEGRADED),
        (H.DEGRADED, H.HEALTHY),
    ]


def test_fatal_xid_holds_longer_than_the_quiet_period(make_rig: MakeRig) -> None:
    rig = make_rig("dgx-h100", recovery_quiet_s=60, fatal_hold_s=600)
    rig.control.inject("xid", 0, code=62)
    rig.pump()
    rig.clock.advance(120)
    rig.model.tick()
    assert rig.gpu(0).state is H.UNHEALTHY
    rig.clock.advance(500)
    rig.model.tick()
    assert rig.gpu(0).state is H.HEALTHY


def test_operator_ignore_list(make_rig: MakeRig) -> None:
    rig = make_rig("dgx-h100", ignore_xids=(62,))
    rig.control.inject("xid", 0, code=62)
    rig.pump()
    assert rig.gpu(0).state is H.HEALTHY
    assert rig.model.node_health().xids_total[(rig.uuids[0], 62)] == 1  # still counted


def _mig_rig(make_rig: MakeRig) -> Any:
    rig = make_rig("dgx-h100")
    rig.node.set_mig_mode(0, True)
    rig.node.reset_gpu(0)
    geometry = rig.node.mig_geometry(0)
    assert geometry is not None
    profile = geometry.profile("1g.10gb")
    assert profile is not None
    a = rig.node.create_gpu_instance(0, "1g.10gb", Placement(0, 1))
    b = rig.node.create_gpu_instance(0, "1g.10gb", Placement(1, 1))
    rig.pump()
    return rig, a.uuid, b.uuid


def test_xid_on_a_mig_instance_marks_only_that_instance(make_rig: MakeRig) -> None:
    rig, mig_a, mig_b = _mig_rig(make_rig)
    rig.control.inject("xid", 0, code=46, mig_uuid=mig_a)
    rig.pump()
    health = rig.model.device_health()
    assert health[mig_a].state is H.UNHEALTHY
    assert "MIG instance" in health[mig_a].reasons[0]
    assert health[mig_b].state is H.HEALTHY
    assert rig.gpu(0).state is H.HEALTHY


def test_gpu_fault_marks_the_gpu_and_all_its_mig_devices(make_rig: MakeRig) -> None:
    rig, mig_a, mig_b = _mig_rig(make_rig)
    rig.control.inject("xid", 0, code=79, mig_uuid=mig_a)  # fatal: hits the whole GPU
    rig.pump()
    health = rig.model.device_health()
    assert {health[u].state for u in (mig_a, mig_b, rig.uuids[0])} == {H.LOST}


def test_transition_reaches_subscriber_on_the_event_path(make_rig: MakeRig) -> None:
    rig = make_rig("dgx-h100")
    rig.control.inject("xid", 5, code=48)
    event = rig.watcher.wait(1.0)
    assert event is not None
    rig.model.on_event(event)  # no snapshot needed
    assert [t.current.gpu_index for t in rig.transitions] == [5]
    assert rig.transitions[0].current.state is H.UNHEALTHY


def test_unstable_node_stays_unstable_after_a_restart(make_rig: MakeRig, tmp_path: Path) -> None:
    history = tmp_path / "agent" / "health" / "history.json"
    rig = make_rig("dgx-h100", history=history)
    for gpu in (0, 1):
        rig.control.inject("lost", gpu)
    rig.pump()
    assert rig.model.node_health().level is StabilityLevel.UNSTABLE
    rig.model.save()
    # A new agent process: a fresh model reading the same history, before any snapshot.
    again = HealthModel(rig.model.config, history_path=history, clock=rig.clock)
    node = again.node_health()
    assert node.level is StabilityLevel.UNSTABLE
    assert again.device_health()[rig.uuids[0]].state is H.LOST  # fail closed
    rig.clock.advance(10)
    again.on_snapshot(rig.node.snapshot())
    assert again.node_health().level is StabilityLevel.UNSTABLE


def test_flapping_gpu_makes_node_unstable(make_rig: MakeRig) -> None:
    rig = make_rig("dgx-h100", recovery_quiet_s=10, flap_transitions=6, flap_window_s=3600,
                   half_life_s=60)  # fmt: skip
    for _ in range(3):
        rig.control.inject("thermal", 0)
        rig.pump()
        rig.control.clear(0)
        rig.clock.advance(11)
        rig.pump()
        rig.clock.advance(300)  # the score decays away between the episodes
    node = rig.model.node_health()
    assert node.score < 0.1
    assert node.flapping
    assert node.level is StabilityLevel.UNSTABLE


def test_one_incident_counts_once_in_the_score(make_rig: MakeRig) -> None:
    # A DBE on an H100 arrives as a DBE event, XID 48 and a pending remap: one incident, scored
    # at its worst fault (XID 48: unhealthy, drain -> 8), not 4 + 8 + 4.
    rig = make_rig("dgx-h100")
    rig.control.inject("ecc-dbe", 0)
    rig.pump()
    keys = {f.key for f in rig.model.faults()}
    assert {"ecc-dbe", "xid:48", "remap-pending"} <= keys
    assert rig.model.node_health().score == pytest.approx(8.0)


def test_xid_storm_is_one_incident_and_every_event_is_counted(make_rig: MakeRig) -> None:
    rig = make_rig("dgx-h100")
    for _ in range(50):
        rig.control.inject("xid", 1, code=13)
    rig.pump()
    node = rig.model.node_health()
    assert node.xids_total[(rig.uuids[1], 13)] == 50
    assert node.score == pytest.approx(0.25)
