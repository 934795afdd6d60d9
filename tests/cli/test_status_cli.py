"""`nodeagent status`: the live view's data and text on a simulated node."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from nodeagent.cli.main import app
from nodeagent.sim.control import SimControl


def invoke(*args: str):
    return CliRunner().invoke(app, ["status", *args])


def test_json_shows_load_mig_layout_and_lost_gpus(make_node, sim_state_dir: Path) -> None:
    node = make_node("a30x4")
    control = SimControl(sim_state_dir)
    control.set_mig_mode(0, True)
    control.reset_gpu(0)
    from nodeagent.gpu.types import Placement

    node.create_gpu_instance(0, "2g.12gb", Placement(0, 2))
    gi = node.create_gpu_instance(0, "1g.6gb", Placement(2, 1))
    control.add_process(0, mig_uuid=gi.uuid)
    control.add_process(1)
    control.inject("lost", 3)
    common = ["--simulate", "a30x4", "--state-dir", str(sim_state_dir)]
    result = invoke("--json", *common, "--agent-state-dir", str(sim_state_dir / "none"))
    assert result.exit_code == 0, result.output
    gpus = {g["gpu"]: g for g in json.loads(result.output)["gpus"]}
    assert gpus[0]["mig"] == "1x1g.6gb 1x2g.12gb (1 busy)"
    assert gpus[1]["processes"] == 1
    assert gpus[1]["memory_used_bytes"] > 0
    assert gpus[2]["processes"] == 0
    assert gpus[3]["lost"] is True
    assert gpus[3]["health"] == "lost"
    assert gpus[1]["health"] == "unknown"  # no agent: health is not guessed

    text = invoke(*common, "--agent-state-dir", str(sim_state_dir / "none"))
    assert text.exit_code == 0, text.output
    assert "no agent running" in text.output
    assert "LOST" in text.output


def test_watch_interval_must_be_sane(sim_state_dir: Path) -> None:
    result = invoke("--watch", "0.01", "--simulate", "t4", "--state-dir", str(sim_state_dir))
    assert result.exit_code == 2
