"""Remediation steps gate a GPU's return: the hold, reset (allowed, capped, never busy) and
validation, in order, on a simulated node."""

from __future__ import annotations

import errno
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from nodeagent.config.health import HealthSection
from nodeagent.config.pool_policy import RemediationPolicy
from nodeagent.gpu.node import GpuNode
from nodeagent.gpu.types import EventKind, GpuEvent
from nodeagent.health import validation
from nodeagent.health.model import HealthModel
from nodeagent.health.reporter import desired_flags
from nodeagent.health.statefile import to_json
from nodeagent.health.validation import GpuValidator
from nodeagent.health.xids import Action
from nodeagent.runtime.health_source import HealthState
from nodeagent.sim.control import SimControl
from nodeagent.testing.clock import FakeClock

PASS = (sys.executable, "-c", "print('all good')")
FAIL = (sys.executable, "-c", "print('boom'); raise SystemExit(3)")


@dataclass
class Rig:
    node: GpuNode
    model: HealthModel
    clock: FakeClock
    resets: list[int] = field(default_factory=list)

    def state(self, index: int) -> HealthState:
        return self.model.device_health()[self.node.info(index).uuid].state

    def reasons(self, index: int) -> tuple[str, ...]:
        return self.model.device_health()[self.node.info(index).uuid].reasons

    def fault_and_clear(self, index: int) -> None:
        """An NVLink XID (unhealthy, held fatal_hold_s), then quiet until it expires."""
        uuid = self.node.info(index).uuid
        self.model.on_event(GpuEvent(EventKind.XID, index, uuid, 74, None, None, self.clock()))
        assert self.state(index) is HealthState.UNHEALTHY
        self.clock.advance(11)
        self.model.tick()


@pytest.fixture
def rig(make_node: Callable[..., GpuNode]) -> Rig:
    node = make_node("dgx-h100")
    clock = FakeClock()
    model = HealthModel(HealthSection(recovery_quiet_s=5, fatal_hold_s=10), clock=clock)
    model.validation_hold = True
    model.on_snapshot(node.snapshot())
    return Rig(node, model, clock)


def validator(
    rig: Rig, policy: RemediationPolicy, processes: int = 0, resets_file: Path | None = None
) -> GpuValidator:
    def reset(index: int) -> None:
        rig.resets.append(index)

    return GpuValidator(
        rig.model,
        lambda: policy,
        reset=reset,
        processes=lambda _: processes,
        clock=rig.clock,
        resets_file=resets_file,
    )


def test_a_cleared_fault_holds_the_gpu_until_validation_passes(rig: Rig) -> None:
    rig.fault_and_clear(2)
    assert rig.state(2) is HealthState.UNHEALTHY
    assert rig.reasons(2)[0].startswith("awaiting validation after: xid 74")
    v = validator(rig, RemediationPolicy(enabled=True, validate_command=PASS))
    (step,) = v.run_once()
    assert (step.step, step.result) == ("validate", "passed")
    assert "all good" in step.detail  # the output tail is recorded
    assert rig.state(2) is HealthState.HEALTHY
    assert v.counts() == {(2, rig.node.info(2).uuid, "validate", "passed"): 1}
    assert v.run_once() == []  # nothing held any more


def test_a_failed_validation_keeps_it_withdrawn_and_retries(rig: Rig) -> None:
    rig.fault_and_clear(1)
    policy = RemediationPolicy(enabled=True, validate_command=FAIL, retry_s=60)
    v = validator(rig, policy)
    (step,) = v.run_once()
    assert step.result == "failed"
    assert step.detail == "exit 3: boom"
    assert rig.state(1) is HealthState.UNHEALTHY
    assert rig.reasons(1) == ("validation failed: validate: exit 3: boom",)
    assert not rig.state(1).schedulable
    assert v.run_once() == []  # not before retry_s
    rig.clock.advance(61)
    assert [s.result for s in v.run_once()] == ["failed"]
    assert v.passed() == {rig.node.info(1).uuid: False}


def test_a_held_gpu_says_what_happens_next_never_a_bare_none(rig: Rig, tmp_path: Path) -> None:
    rig.fault_and_clear(1)
    uuid = rig.node.info(1).uuid
    waiting = rig.model.device_health()[uuid]
    assert (waiting.state, waiting.action) == (
        HealthState.UNHEALTHY,
        "wait: the remediation steps run now; it serves again when they pass",
    )
    validator(rig, RemediationPolicy(enabled=True, validate_command=FAIL, retry_s=60)).run_once()
    health = rig.model.node_health()
    (row,) = [d for d in to_json(health, "node-1")["devices"] if d["uuid"] == uuid]
    assert row["state"] == "unhealthy"
    assert row["action"] == (
        "fix what the failed step reports (see the reason); the steps re-run every 60s"
    )
    assert row["reasons"] == ["validation failed: validate: exit 3: boom"]
    # The node's condition message carries it too, so `kubectl describe node` says it.
    message = desired_flags(health, rig.model.config).message
    assert "the steps re-run every 60s" in message
    # A restart that starts from this published status does not read it as "drain".
    status = tmp_path / "status.json"
    status.write_text(json.dumps(to_json(health, "node-1")))
    restored = HealthModel(
        rig.model.config, history_path=tmp_path / "none.json", status_path=status, clock=rig.clock
    )
    assert [f.action for f in restored.faults() if f.gpu_uuid == uuid] == [Action.NONE]


@pytest.mark.parametrize(
    ("policy", "processes", "expected", "resets"),
    [
        pytest.param(
            RemediationPolicy(enabled=True, steps=("reset", "validate"), allow_reset=True),
            0,
            [("reset", "passed"), ("validate", "passed")],
            [3],
            id="reset-then-validate",
        ),
        pytest.param(
            RemediationPolicy(enabled=True, steps=("reset", "validate")),
            0,
            [("reset", "skipped"), ("validate", "passed")],
            [],
            id="reset-not-allowed",
        ),
        pytest.param(
            RemediationPolicy(enabled=True, steps=("reset", "validate"), allow_reset=True),
            2,
            [("reset", "skipped"), ("validate", "passed")],
            [],
            id="never-while-a-process-runs",
        ),
        pytest.param(
            RemediationPolicy(
                enabled=True, steps=("validate", "reset"), allow_reset=True, validate_command=FAIL
            ),
            0,
            [("validate", "failed")],
            [],
            id="in-order-a-failure-stops-the-rest",
        ),
    ],
)
def test_steps_in_order(
    rig: Rig,
    policy: RemediationPolicy,
    processes: int,
    expected: list[tuple[str, str]],
    resets: list[int],
) -> None:
    rig.fault_and_clear(3)
    steps = validator(rig, policy, processes).run_once()
    assert [(s.step, s.result) for s in steps] == expected
    assert rig.resets == resets


def test_resets_are_capped_per_period(rig: Rig) -> None:
    policy = RemediationPolicy(
        enabled=True, steps=("reset",), allow_reset=True, max_resets=1, reset_period_s=3600
    )
    v = validator(rig, policy)
    rig.fault_and_clear(4)
    rig.fault_and_clear(5)
    steps = v.run_once()
    assert [(s.gpu_index, s.result) for s in steps] == [(4, "passed"), (5, "skipped")]
    assert "cap reached" in steps[1].detail
    rig.clock.advance(3600)
    rig.fault_and_clear(6)
    assert [(s.gpu_index, s.result) for s in v.run_once()] == [(6, "passed")]
    assert rig.resets == [4, 6]


CAPPED = RemediationPolicy(
    enabled=True, steps=("reset",), allow_reset=True, max_resets=1, reset_period_s=3600
)


def test_the_reset_cap_holds_across_agent_restarts(rig: Rig, tmp_path: Path) -> None:
    history = tmp_path / "health" / "resets.json"
    rig.fault_and_clear(4)
    assert [s.result for s in validator(rig, CAPPED, resets_file=history).run_once()] == ["passed"]
    assert len(json.loads(history.read_text())) == 1
    restarted = validator(rig, CAPPED, resets_file=history)  # a new agent, same state dir
    rig.fault_and_clear(5)
    (step,) = restarted.run_once()
    assert (step.result, rig.resets) == ("skipped", [4])
    assert "cap reached" in step.detail
    rig.clock.advance(3600)  # the period is over, for a restarted agent too
    rig.fault_and_clear(6)
    assert [s.result for s in validator(rig, CAPPED, resets_file=history).run_once()] == ["passed"]
    assert rig.resets == [4, 6]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        pytest.param("[17000", "not valid JSON", id="truncated"),
        pytest.param('{"at": 1}', "(top): Input should be a valid array", id="wrong shape"),
        pytest.param('[17000, "17001"]', "1: Input should be a valid number", id="not a time"),
        pytest.param(None, "a part of the path is a file, not a directory", id="unreadable"),
        pytest.param("[]", "No space left on device", id="disk full"),
    ],
)
def test_an_unusable_reset_history_refuses_resets(
    rig: Rig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str | None, problem: str
) -> None:
    if content is None:
        (tmp_path / "health").write_text("a file where the directory should be")
    else:
        (tmp_path / "health").mkdir()
        (tmp_path / "health" / "resets.json").write_text(content)

    def disk_full(path: Path, data: object, **_: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(validation, "write_json_atomic", disk_full)
    rig.fault_and_clear(4)
    (step,) = validator(rig, CAPPED, resets_file=tmp_path / "health" / "resets.json").run_once()
    assert (step.step, step.result, rig.resets) == ("reset", "skipped", [])  # fails closed
    assert problem in step.detail
    assert "resets.json" in step.detail


def test_a_real_reset_through_the_gpu_layer(rig: Rig, sim_state_dir: Path) -> None:
    """The reset step drives GpuNode.reset_gpu: refused (a step failure) while a process runs."""
    pid = SimControl(sim_state_dir).add_process(0)
    rig.fault_and_clear(0)
    policy = RemediationPolicy(enabled=True, steps=("reset",), allow_reset=True, max_resets=5)
    v = GpuValidator(rig.model, lambda: policy, reset=rig.node.reset_gpu, processes=lambda _: 0)
    (step,) = v.run_once()
    assert step.result == "failed"
    assert "process" in step.detail
    SimControl(sim_state_dir).remove_process(pid)
    rig.clock.advance(301)
    v2 = GpuValidator(rig.model, lambda: policy, reset=rig.node.reset_gpu, processes=lambda _: 0)
    (step,) = v2.run_once()
    assert step.result == "passed"
    assert rig.state(0) is HealthState.HEALTHY


def test_without_the_hold_a_cleared_gpu_returns_at_once(rig: Rig) -> None:
    rig.model.validation_hold = False
    rig.fault_and_clear(7)
    assert rig.state(7) is HealthState.HEALTHY
    assert rig.model.pending_validation() == []


def test_each_step_is_an_event_on_the_node(rig: Rig, control_plane, kube_ns: str) -> None:
    from kubernetes import client

    from nodeagent.kube.events import EventRecorder

    core = client.CoreV1Api(control_plane.api_client())
    node_name = f"{kube_ns}-gpu-node"[:63]
    policy = RemediationPolicy(enabled=True, steps=("reset", "validate"), validate_command=FAIL)
    v = GpuValidator(
        rig.model,
        lambda: policy,
        reset=rig.resets.append,
        processes=lambda _: 0,
        recorder=EventRecorder(core, node_name),
        clock=rig.clock,
    )
    rig.fault_and_clear(1)
    v.run_once()
    events = [
        e
        for e in core.list_namespaced_event("default").items
        if e.involved_object.kind == "Node" and e.involved_object.name == node_name
    ]
    by_reason = {e.reason: e for e in events}
    assert set(by_reason) == {"GPURemediationResetSkipped", "GPURemediationValidateFailed"}
    assert by_reason["GPURemediationValidateFailed"].type == "Warning"
    assert "exit 3: boom" in by_reason["GPURemediationValidateFailed"].message
    assert by_reason["GPURemediationResetSkipped"].type == "Normal"
