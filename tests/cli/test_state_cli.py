"""State directories as the commands meet them: a simulated node's directory names its node,
and an agent state file replaced by a directory is one line, not a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nodeagent.sim.control import SimControl
from tests.cli.test_inventory_cli import nodeagent


def test_a_state_dir_alone_opens_the_simulated_node_it_holds(tmp_path: Path) -> None:
    SimControl(tmp_path, preset="a30x4").reset("a30x4")
    by_env = nodeagent("mig", "show", "--json", env={"NODEAGENT_SIM_STATE": str(tmp_path)})
    assert by_env.returncode == 0, by_env.stderr
    assert "no NVIDIA driver" not in by_env.stderr
    by_flag = nodeagent("gpus", "--json", "--state-dir", str(tmp_path))
    assert by_flag.returncode == 0, by_flag.stderr
    assert [g["name"] for g in json.loads(by_flag.stdout)] == ["NVIDIA A30"] * 4


def test_a_state_dir_without_a_node_still_asks_for_a_preset(tmp_path: Path) -> None:
    result = nodeagent("mig", "show", env={"NODEAGENT_SIM_STATE": str(tmp_path)})
    assert result.returncode == 2
    assert "--simulate PRESET" in result.stderr
    assert not any(tmp_path.iterdir()), "an empty state directory was seeded without a preset"


def test_a_damaged_node_in_the_state_dir_is_named_not_a_missing_driver(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text("{")
    result = nodeagent("mig", "show", env={"NODEAGENT_SIM_STATE": str(tmp_path)})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"{tmp_path / 'state.json'} is corrupt" in lines[0]
    assert "nodeagent sim reset" in lines[0]


def test_health_status_replaced_by_a_directory_is_one_line_naming_it(tmp_path: Path) -> None:
    status = tmp_path / "health" / "status.json"
    status.mkdir(parents=True)
    for json_flag in ([], ["--json"]):
        result = nodeagent("health", *json_flag, "--agent-state-dir", str(tmp_path))
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr
        assert result.stderr.strip().splitlines() == [
            f"error: cannot read {status}: it is a directory; remove that directory; a running "
            "agent then writes it again at its next report"
        ]


def test_status_with_a_directory_for_the_health_file_shows_health_unknown(
    tmp_path: Path,
) -> None:
    sim, agent = tmp_path / "sim", tmp_path / "agent"
    (agent / "health" / "status.json").mkdir(parents=True)
    result = nodeagent(
        "status", "--json", "--simulate", "t4", "--state-dir", str(sim),
        "--agent-state-dir", str(agent),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert [g["health"] for g in json.loads(result.stdout)["gpus"]] == ["unknown"]
    assert "it is a directory" in result.stderr
    assert "Traceback" not in result.stderr


def _status(**change: object) -> dict[str, object]:
    """A health state file as the agent writes it (nodeagent.health.statefile.to_json)."""
    device = {"uuid": "GPU-1", "gpu": 0, "parent": None, "state": "healthy", "reasons": [],
              "action": None, "since_s": 1.0}  # fmt: skip
    return {
        "version": 1, "node": "n", "pid": 1, "timestamp_s": 1.0,
        "stability": {"level": "stable", "score": 10.0, "flapping": False,
                      "transitions_in_window": 0},
        "health": "healthy", "driver_version": "550", "reasons": [], "devices": [device],
        "events_total": {}, "xids_total": [],
    } | change  # fmt: skip


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"devices": "x"}, "devices"),
        ({"devices": None}, "devices"),
        ({"stability": None}, "stability"),
        ({"stability": {"level": 5}}, "stability.level"),
        ({"timestamp_s": "x"}, "timestamp_s"),
        ({"timestamp_s": 1e300}, "timestamp_s"),
        ({"node": None}, "node"),
    ],
)
def test_a_health_state_file_of_the_wrong_shape_is_named(
    tmp_path: Path, change: dict[str, object], field: str
) -> None:
    agent = tmp_path / "agent"
    status = agent / "health" / "status.json"
    status.parent.mkdir(parents=True)
    status.write_text(json.dumps(_status(**change)))
    result = nodeagent("health", "--agent-state-dir", str(agent))
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"error: {status}: {field}"), result.stderr
    shown = nodeagent(
        "status", "--json", "--simulate", "t4", "--state-dir", str(tmp_path / "sim"),
        "--agent-state-dir", str(agent),
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert [g["health"] for g in json.loads(shown.stdout)["gpus"]] == ["unknown"]


def test_a_health_state_file_as_written_is_read(tmp_path: Path) -> None:
    status = tmp_path / "health" / "status.json"
    status.parent.mkdir(parents=True)
    status.write_text(json.dumps(_status()))
    result = nodeagent("health", "--json", "--agent-state-dir", str(tmp_path))
    assert "Traceback" not in result.stderr
    assert f"{status}:" not in result.stderr
