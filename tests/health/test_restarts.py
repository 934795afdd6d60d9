"""Health across agent restarts: holds and quiet periods never shorten, an incident counts once,
an unusable history fails closed, and every state change is one log line."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from nodeagent.health.model import HealthModel
from nodeagent.health.reporter import Reporter
from nodeagent.health.score import StabilityLevel
from nodeagent.health.statefile import write_status
from nodeagent.runtime.health_source import HealthState
from nodeagent.testing.clock import FakeClock
from nodeagent.testing.health import ScriptedHealth
from nodeagent_device_plugin.withheld import HealthTracker
from tests.health.conftest import MakeRig, Rig

H = HealthState
QUIET = 20.0


def paths(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "health" / "history.json", tmp_path / "health" / "status.json"


def restart(rig: Rig, tmp_path: Path) -> HealthModel:
    """A new agent process: a fresh model on the same files and clock (no snapshot yet)."""
    history, status = paths(tmp_path)
    return HealthModel(
        rig.model.config,
        expected_driver=rig.model.checks.expected_driver,
        history_path=history,
        status_path=status,
        clock=rig.clock,
    )


def run_for(rig: Rig, model: HealthModel, seconds: int) -> None:
    """Sample once a second for ``seconds``, saving as the reporter does."""
    for _ in range(seconds):
        rig.clock.advance(1)
        model.on_snapshot(rig.node.snapshot())
        model.save()


def lost_gpu(make_rig: MakeRig, tmp_path: Path, seconds: int) -> Rig:
    """A DGX H100 whose GPU 2 has been lost for ``seconds``, its history in ``tmp_path``."""
    history, _ = paths(tmp_path)
    rig = make_rig("dgx-h100", history=history, recovery_quiet_s=QUIET)
    rig.control.inject("lost", 2)
    run_for(rig, rig.model, seconds)
    return rig


# --- item 6: a restart never shortens a hold -------------------------------------------------


@pytest.mark.parametrize("clean_stop", [True, False], ids=["sigterm", "kill-9"])
def test_a_restart_after_the_fault_cleared_keeps_the_whole_quiet_period(
    make_rig: MakeRig, tmp_path: Path, clean_stop: bool
) -> None:
    rig = lost_gpu(make_rig, tmp_path, 15)
    rig.control.clear(2)
    cleared_at = rig.clock()
    run_for(rig, rig.model, 3)
    if clean_stop:
        rig.model.save(final=True)
    again = restart(rig, tmp_path)
    assert again.device_health()[rig.uuids[2]].state is H.LOST  # fail closed before a sample
    for _ in range(60):
        rig.clock.advance(0.5)
        again.on_snapshot(rig.node.snapshot())
        again.save()
        if again.device_health()[rig.uuids[2]].state is H.HEALTHY:
            break
    healthy_at = rig.clock()
    assert again.device_health()[rig.uuids[2]].state is H.HEALTHY
    assert healthy_at >= cleared_at + QUIET, (healthy_at - cleared_at, QUIET)


def test_the_device_plugins_quiet_period_survives_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "withheld.json"
    mono, wall = FakeClock(100.0), FakeClock(1_700_000_000.0)

    def tick(seconds: float) -> None:
        mono.advance(seconds)
        wall.advance(seconds)

    source = ScriptedHealth()
    source.set("GPU-a", H.LOST)
    tracker = HealthTracker(60.0, lambda: None, mono, state_file=state, wall=wall)
    tracker.attach(source)
    assert tracker.reason("GPU-a") is not None
    tick(5)
    source.set("GPU-a", H.HEALTHY)  # the model's hold ended: the plugin's quiet period starts
    tick(20)
    tracker.detach()
    # The agent restarts 20 s into the 60 s quiet period; the model says healthy now.
    again = HealthTracker(60.0, lambda: None, mono, state_file=state, wall=wall)
    again.attach(source)
    assert again.reason("GPU-a") is not None, "the quiet period was skipped by the restart"
    tick(39)
    again.poll()
    assert again.reason("GPU-a") is not None
    tick(2)
    again.poll()
    assert again.reason("GPU-a") is None


def test_a_device_still_faulty_at_shutdown_gets_a_whole_quiet_period(tmp_path: Path) -> None:
    state = tmp_path / "withheld.json"
    mono, wall = FakeClock(100.0), FakeClock(1_700_000_000.0)
    source = ScriptedHealth()
    source.set("GPU-a", H.UNHEALTHY)
    tracker = HealthTracker(60.0, lambda: None, mono, state_file=state, wall=wall)
    tracker.attach(source)
    tracker.detach()
    source.set("GPU-a", H.HEALTHY)  # it recovered while the agent was down
    again = HealthTracker(60.0, lambda: None, mono, state_file=state, wall=wall)
    again.attach(source)
    mono.advance(59)
    again.poll()
    assert again.reason("GPU-a") is not None
    mono.advance(2)
    again.poll()
    assert again.reason("GPU-a") is None


# --- item 7: one incident, however often the agent restarts; node-wide conditions once ---------


def test_driver_drift_counts_once_per_node_and_once_across_restarts(
    make_rig: MakeRig, tmp_path: Path
) -> None:
    history, _ = paths(tmp_path)
    rig = make_rig("dgx-h100", history=history, expected_driver="1.0", recovery_quiet_s=300)
    first = rig.model.node_health()
    gpus = {d.uuid: d.state for d in first.devices if d.uuid in rig.uuids}
    assert gpus == dict.fromkeys(rig.uuids, H.DEGRADED)
    assert first.score == pytest.approx(1.0)  # one driver per host, not one per GPU
    rig.model.save(final=True)
    model = rig.model
    for _ in range(3):
        rig.clock.advance(3600)  # a reboot longer than the quiet period
        model = restart(rig, tmp_path)
        model.on_snapshot(rig.node.snapshot())
        model.save(final=True)
        assert model.node_health().level is StabilityLevel.STABLE
    # The same incident decayed over 3 hours (half-life 24 h): never counted again.
    assert model.node_health().score == pytest.approx(2 ** (-3 / 24), rel=1e-3)
    # The pool's expectation is fixed: the condition ends on every GPU at once, one change.
    fixed = HealthModel(model.config, history_path=paths(tmp_path)[0], clock=rig.clock)
    fixed.on_snapshot(rig.node.snapshot())
    rig.clock.advance(301)
    fixed.on_snapshot(rig.node.snapshot())
    assert fixed.score.transitions_in_window(rig.clock()) == 1
    assert not fixed.node_health().flapping


# --- item 8: an unusable history fails closed -----------------------------------------------------

WRONG = [
    pytest.param('{"version":1,"faults":"x"}', id="faults-not-a-list"),
    pytest.param('{"version":1,"faults":[{"uuid":"GPU-1"}]}', id="fault-without-gpu"),
    pytest.param('{"version":1,"score":{"records":[{"t":"x"}]}}', id="bad-record"),
    pytest.param('{"version":1,"score":{"score_level":"great"}}', id="bad-level"),
    pytest.param('{"version":1,"score":[]}', id="score-not-an-object"),
    pytest.param("[1, 2, 3]", id="a-list"),
    pytest.param('{"version":7}', id="unknown-version"),
    pytest.param('{"version":1,', id="truncated"),
    pytest.param("\x00\xff garbage", id="not-json"),
]


@pytest.mark.parametrize("content", WRONG)
def test_an_unusable_history_is_set_aside_and_the_node_starts_unknown(
    make_rig: MakeRig, tmp_path: Path, caplog: pytest.LogCaptureFixture, content: str
) -> None:
    history, status = paths(tmp_path)
    history.parent.mkdir(parents=True)
    history.write_text(content)
    rig = make_rig("dgx-h100")
    with caplog.at_level(logging.ERROR, logger="nodeagent.health"):
        model = HealthModel(
            rig.model.config, history_path=history, status_path=status, clock=rig.clock
        )
    assert not history.exists()
    aside = list(history.parent.glob("history.json.unusable-*"))
    assert len(aside) == 1
    assert aside[0].read_text() == content
    assert any(str(history) in r.getMessage() for r in caplog.records)
    node = model.node_health()
    assert node.history_errors == 1
    assert node.level is StabilityLevel.UNKNOWN
    assert not model.known
    model.on_snapshot(rig.node.snapshot())
    assert model.node_health().level is StabilityLevel.STABLE


def test_an_unusable_history_starts_from_the_published_status(
    make_rig: MakeRig, tmp_path: Path
) -> None:
    history, status = paths(tmp_path)
    rig = make_rig("dgx-h100", history=history)
    for gpu in (0, 1):
        rig.control.inject("lost", gpu)
    rig.pump()
    published = rig.model.node_health()
    assert published.level is StabilityLevel.UNSTABLE
    write_status(tmp_path, published, "node-1")
    history.parent.mkdir(parents=True, exist_ok=True)
    history.write_text('{"version":1,"faults":"x"}')
    model = HealthModel(rig.model.config, history_path=history, status_path=status, clock=rig.clock)
    node = model.node_health()
    assert node.level is StabilityLevel.UNSTABLE
    assert node.score == pytest.approx(published.score)
    assert model.device_health()[rig.uuids[0]].state is H.LOST


def test_the_reporter_publishes_nothing_before_the_health_is_known(
    make_rig: MakeRig, tmp_path: Path
) -> None:
    history, status = paths(tmp_path)
    rig = make_rig("dgx-h100")
    model = HealthModel(rig.model.config, history_path=history, status_path=status, clock=rig.clock)
    reporter = Reporter(model, tmp_path, "node-1")
    reporter.report_once()
    assert not status.exists(), "a status was published before anything was known"
    model.on_snapshot(rig.node.snapshot())
    reporter.report_once()
    assert json.loads(status.read_text())["stability"]["level"] == "stable"


# --- item 9: one log line per state change ----------------------------------------------------


def test_every_health_change_is_one_log_line(
    make_rig: MakeRig, caplog: pytest.LogCaptureFixture
) -> None:
    rig = make_rig("dgx-h100", recovery_quiet_s=10)
    with caplog.at_level(logging.INFO, logger="nodeagent.health"):
        rig.control.inject("xid", 3, code=79)
        rig.pump()
        rig.control.clear(3)
        rig.clock.advance(3700)
        rig.pump()
    lines = [r for r in caplog.records if "->" in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.WARNING, logging.INFO], [
        r.getMessage() for r in lines
    ]
    down, up = (r.getMessage() for r in lines)
    assert "GPU 3" in down
    assert "healthy -> lost" in down
    assert "xid 79" in down
    assert "reboot the node" in down
    assert "lost -> healthy" in up


def test_a_gpu_lost_across_a_restart_stays_the_same_lost_device(
    make_rig: MakeRig, tmp_path: Path, sim_state_dir: Path
) -> None:
    from nodeagent.agent.backend import open_node

    rig = lost_gpu(make_rig, tmp_path, 5)
    score = rig.model.node_health().score
    # A new process cannot read the lost GPU's UUID; its model must still know the GPU.
    node = open_node(simulate="dgx-h100", state_dir=sim_state_dir)
    try:
        assert node.snapshot().gpus[2].info.uuid != rig.uuids[2]
        again = restart(rig, tmp_path)
        for _ in range(int(QUIET) * 2):
            rig.clock.advance(1)
            again.on_snapshot(node.snapshot())
        health = again.device_health()
        assert health[rig.uuids[2]].state is H.LOST, "the lost GPU came back healthy"
        assert {d.gpu_index for d in health.values() if d.state is H.LOST} == {2}
        assert len([d for d in health.values() if d.gpu_index == 2]) == 1
        assert again.node_health().score == pytest.approx(score, rel=1e-2), "counted again"
    finally:
        node.close()


def test_a_kill_right_after_the_first_sample_of_a_restart_keeps_the_hold(
    make_rig: MakeRig, tmp_path: Path
) -> None:
    rig = lost_gpu(make_rig, tmp_path, 3)
    rig.clock.advance(400)  # a long downtime; the GPU stays lost throughout
    second = restart(rig, tmp_path)
    second.on_snapshot(rig.node.snapshot())  # seen again; killed before the reporter saves
    seen_at = rig.clock()
    third = restart(rig, tmp_path)
    rig.control.clear(2)
    rig.clock.advance(QUIET - 1)
    third.on_snapshot(rig.node.snapshot())
    assert third.device_health()[rig.uuids[2]].state is H.LOST, "the hold was shortened"
    rig.clock.advance(2)
    third.on_snapshot(rig.node.snapshot())
    assert third.device_health()[rig.uuids[2]].state is H.HEALTHY
    assert rig.clock() >= seen_at + QUIET
