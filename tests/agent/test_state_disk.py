"""The whole agent with its state directory on a small disk that fills while it runs.

Every component writes under the state directory; none may log a traceback or one line per
write. The health state is logged once, the last good status stays, and a fault seen while the
disk was full is in the history once it frees, so the next agent remembers it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from nodeagent.agent.daemon import Agent
from nodeagent.config.schema import load_agent_config
from nodeagent.gpu.node import GpuNode
from nodeagent.health.model import HealthModel
from nodeagent.health.statefile import history_path, status_path
from nodeagent.sim.control import SimControl
from nodeagent.testing.waiting import wait_until
from tests.health.fulldisk import small_disk


def _agent(config: Path, node: GpuNode) -> Agent:
    return Agent(load_agent_config(config, environ={}), node, config_path=config)


def test_a_disk_that_fills_under_the_running_agent(
    make_node, sim_state_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with small_disk() as disk:
        state = disk.path / "state"
        config = tmp_path / "agent.yaml"
        config.write_text(
            f"version: v1\nstate_dir: '{state}'\nnode: {{name: gpu-1}}\n"
            "sampler: {interval_s: 0.1}\n"
            "device_plugin: {enabled: false}\n"
            "metrics: {enabled: false}\n"
            "kubernetes: {enabled: false}\n"
            "health: {report_interval_s: 1}\n"
        )
        node = make_node("dgx-h100")
        agent = _agent(config, node)
        status = status_path(state)
        with caplog.at_level(logging.INFO, logger="nodeagent"):
            agent.start()
            try:
                assert agent.wait_ready(20)
                assert wait_until(lambda: status.exists(), timeout_s=10)
                disk.fill()
                good = status.read_bytes()
                SimControl(sim_state_dir).inject("xid", 2, code=79)
                assert wait_until(
                    lambda: any("not written" in r.getMessage() for r in caplog.records),
                    timeout_s=10,
                )
                wait_until(lambda: False, timeout_s=3)  # three more reports, all failing
                errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
                assert len(errors) == 1, errors
                assert errors[0].startswith(f"health state not written: cannot write {state}")
                assert "the file system is full; free space on it" in errors[0]
                assert status.read_bytes() == good, "the last good status was not kept whole"
                assert json.loads(good)["health"] == "healthy"
                assert disk.stray_files() == []
                disk.free()
                assert wait_until(
                    lambda: json.loads(status.read_text())["health"] == "lost", timeout_s=10
                )
                # Logged just after the write that recovered, by the writer's thread.
                assert wait_until(
                    lambda: any("written again" in r.getMessage() for r in caplog.records),
                    timeout_s=5,
                )
            finally:
                assert agent.shutdown() == 0
        assert not [r.getMessage() for r in caplog.records if r.exc_info], "a traceback"
        # The next agent: the fault seen while the disk was full is remembered.
        restarted = HealthModel(
            load_agent_config(config, environ={}).health, history_path=history_path(state)
        )
        lost = [d for d in restarted.device_health().values() if d.gpu_index == 2]
        assert lost
        assert {d.state.value for d in lost} == {"lost"}
