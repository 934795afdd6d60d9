"""A feature turned off is a null component built by its own builder: the agent starts and
stops without it, and it shows what an absent feature showed (no metrics port, no health files,
no MIG outcome, nothing attributed or remediated)."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nodeagent.agent import wiring
from nodeagent.agent.daemon import Agent
from nodeagent.config.schema import AgentConfig, load_agent_config
from nodeagent.gpu.node import GpuNode
from nodeagent.health import component as health
from nodeagent.health.statefile import history_path, status_path
from nodeagent.runtime.snapshots import SnapshotStore
from nodeagent_exporters import component as exporters
from nodeagent_mig import reconciler as mig


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(tmp_path: Path, port: int, **overrides: Any) -> AgentConfig:
    return load_agent_config(
        None,
        environ={},
        overrides={
            "state_dir": str(tmp_path / "state"),
            "sampler": {"interval_s": 0.05},
            "device_plugin": {"enabled": False},
            "metrics": {"address": f"127.0.0.1:{port}"},
            **overrides,
        },
    )


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _names(config: AgentConfig, node: GpuNode, tmp_path: Path) -> list[str]:
    wired = wiring.build(
        config,
        node,
        SnapshotStore(),
        restarts={},
        ready=lambda: True,
        alive=lambda: True,
        mig_lock_file=tmp_path / "mig.lock",
    )
    return [c.name for c in wired.components]


@pytest.mark.parametrize(
    ("overrides", "name"),
    [
        pytest.param({"metrics": {"enabled": False}}, "metrics", id="metrics"),
        pytest.param({"health": {"enabled": False}}, "health", id="health"),
        pytest.param({"mig": {"enabled": False}}, "mig-reconciler", id="mig"),
    ],
)
def test_a_feature_turned_off_is_left_out_of_the_supervised_set(
    make_node: Callable[..., GpuNode], tmp_path: Path, overrides: dict[str, Any], name: str
) -> None:
    node = make_node("dgx-h100")
    on = _names(_config(tmp_path / "on", 0, mig={"enabled": True}), node, tmp_path / "on")
    assert name in on
    assert name not in _names(_config(tmp_path, 0, **overrides), node, tmp_path)


def test_the_null_objects_report_what_an_absent_feature_did(tmp_path: Path) -> None:
    off = _config(
        tmp_path,
        0,
        metrics={"enabled": False, "process_attribution": False},
        health={"enabled": False},
        mig={"enabled": False},
    )
    exporter = exporters.build(off, SnapshotStore())
    # Unmeasured, not "none shared": the GPU-state annotation tells the two apart.
    assert exporter.shared_gpus() is None
    assert exporter.measured is None  # the sharing actions stay idle: nothing measures
    assert exporter.capacity_annotations() == {}
    assert exporter.allocations() is None
    assert list(exporter.processes()) == []
    reconciler = mig.build(off, object())  # type: ignore[arg-type]  # a null one reads no node
    assert reconciler.status() is None
    assert reconciler.applied_layout is None
    assert health.build_model(off) is None  # the features' "no health", not "healthy"
    validator = health.build_validator(off, None, object(), SnapshotStore())  # type: ignore[arg-type]
    assert validator.counts() == {}
    assert validator.passed() == {}
    xids = health.build_attributor(off, tuple)
    assert xids.counts() == {}
    assert xids.recorder is None


def test_an_agent_with_health_metrics_and_mig_off_starts_stops_and_publishes_nothing_of_them(
    make_node: Callable[..., GpuNode], tmp_path: Path
) -> None:
    def run(config: AgentConfig, port: int) -> tuple[list[str], bool]:
        agent = Agent(config, make_node("dgx-h100"))
        agent.start()
        try:
            assert agent.wait_ready(10)
            assert agent.snapshots.wait_newer(agent.snapshots.generation, timeout_s=5)
            return [c.name for c in agent.components], _listening(port)
        finally:
            assert agent.shutdown() == 0

    # The features on, so the checks below can fail: a port served, a health status written.
    port = _free_port()
    on = _config(tmp_path / "on", port)
    names, listening = run(on, port)
    assert {"health", "metrics"} <= set(names)
    assert listening
    assert status_path(on.state_dir).exists()

    port = _free_port()
    off = _config(
        tmp_path / "off",
        port,
        metrics={"enabled": False, "address": f"127.0.0.1:{port}"},
        health={"enabled": False},
        mig={"enabled": False},
    )
    names, listening = run(off, port)
    assert names == ["sampler"]
    assert not listening  # no metrics port
    assert not status_path(off.state_dir).exists()  # no health output
    assert not history_path(off.state_dir).exists()
    assert not _listening(port)
