"""What a new operator hits on day one: a corrupt simulated node, a stopped agent's health, a
wrong config path, a reset setting inherited from the agent's shell, an apply that would stop
half-way, and commands that changed something without saying so."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nodeagent.agent.daemon import Agent
from nodeagent.cli.main import app
from nodeagent.config.schema import load_agent_config
from nodeagent.sim.control import SimControl
from nodeagent.sim.state import STATE_FILE


def run(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(app, list(args), env=env)


def base(sim: Path, preset: str = "dgx-a100") -> list[str]:
    return ["--simulate", preset, "--state-dir", str(sim)]


# --- item 11: a corrupt simulated node --------------------------------------------------------


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda text: text[: len(text) // 2], id="truncated"),
        pytest.param(lambda text: '{"schema": 1, "preset": "dgx-a100"}', id="no-gpus"),
        pytest.param(lambda text: text.replace('"gpus":', '"gpuz":'), id="renamed-key"),
        pytest.param(lambda text: text.replace('"numa":', '"n{ma":'), id="gpu-key-renamed"),
        pytest.param(lambda text: "[]", id="a-list"),
        pytest.param(lambda text: "", id="empty"),
    ],
)
@pytest.mark.parametrize("command", [["gpus"], ["mig", "show"], ["status"], ["health"]])
def test_a_corrupt_simulated_node_names_sim_reset(
    tmp_path: Path, damage, command: list[str]
) -> None:
    sim = tmp_path / "sim"
    SimControl(sim, "dgx-a100").state()
    state = sim / STATE_FILE
    state.write_text(damage(state.read_text()))
    result = run(*command, *base(sim))
    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert "corrupt" in errors[0]
    assert f"nodeagent sim reset --simulate dgx-a100 --state-dir {sim}" in errors[0]
    assert "--simulate PRESET or set" not in result.stderr  # not the "no driver" message
    fixed = run("sim", "reset", *base(sim))
    assert fixed.exit_code == 0
    assert run(*command, *base(sim)).exit_code in (0, 1)


def test_temporary_state_files_of_a_killed_writer_are_removed(tmp_path: Path) -> None:
    sim = tmp_path / "sim"
    SimControl(sim, "t4").state()
    leftover = sim / f".{STATE_FILE}.k1ll3d.tmp"
    leftover.write_text("{")
    assert run("gpus", *base(sim, "t4")).exit_code == 0
    assert not leftover.exists()


# --- item 14: status of a stopped agent, a wrong -c, sim commands that say what they did ------


def test_status_marks_a_stopped_agents_health_as_stale(make_node, tmp_path: Path) -> None:
    sim, state = tmp_path / "sim", tmp_path / "agent"
    config = tmp_path / "agent.yaml"
    config.write_text(
        f"version: v1\nstate_dir: {state}\nmetrics: {{enabled: false}}\n"
        "device_plugin: {enabled: false}\nmig: {enabled: false}\nsampler: {interval_s: 0.05}\n"
    )
    agent = Agent(load_agent_config(config, environ={}), make_node("t4", sim), config_path=config)
    agent.start()
    try:
        assert agent.wait_ready(20)
        deadline = time.monotonic() + 10
        while not (state / "health" / "status.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        live = run("status", "--json", *base(sim, "t4"), "--agent-state-dir", str(state))
        assert live.exit_code == 0, live.output
        data = json.loads(live.stdout)
        assert data["agent"]["running"] is True
        assert data["gpus"][0]["health"] == "healthy"
        assert data["gpus"][0]["health_stale"] is False
    finally:
        agent.shutdown()
    stopped = run("status", "--json", *base(sim, "t4"), "--agent-state-dir", str(state))
    data = json.loads(stopped.stdout)
    assert data["agent"]["running"] is False
    assert data["gpus"][0]["health"] == "healthy"
    assert data["gpus"][0]["health_stale"] is True
    text = run("status", *base(sim, "t4"), "--agent-state-dir", str(state))
    assert "agent not running: health is stale" in text.stdout
    assert "healthy (stale)" in text.stdout


@pytest.mark.parametrize("command", ["status", "health"])
def test_a_config_path_that_does_not_exist_is_an_error(tmp_path: Path, command: str) -> None:
    result = run(command, "-c", str(tmp_path / "nonexistent.yaml"), *base(tmp_path, "t4"))
    assert result.exit_code == 2
    assert "nonexistent.yaml" in result.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        pytest.param(["inject", "xid", "--gpu", "0", "--code", "79"], "injected xid", id="inject"),
        pytest.param(["clear", "--gpu", "0"], "cleared the faults of GPU 0", id="clear"),
        pytest.param(["reset-gpu", "--gpu", "0"], "reset GPU 0", id="reset-gpu"),
    ],
)
def test_sim_commands_say_what_they_changed(tmp_path: Path, args: list[str], expected: str) -> None:
    result = run("sim", *args, *base(tmp_path, "t4"))
    assert result.exit_code == 0, result.output
    assert expected in result.stdout
    assert str(tmp_path) in result.stdout


# --- item 14: mig apply decides before changing anything; no reset taken from the env ---------


def pending_node(sim: Path) -> None:
    """A node whose driver leaves a MIG mode change pending until a GPU reset."""
    SimControl(sim, "dgx-a100").set_semantics(mig_mode_applies_at_once=False)


def pending(sim: Path) -> list[bool]:
    out = run("gpus", "--json", *base(sim))
    return [g["mig_pending"] != g["mig_enabled"] for g in json.loads(out.stdout)]


def test_apply_without_yes_refuses_a_mode_change_before_changing_anything(
    tmp_path: Path,
) -> None:
    sim = tmp_path / "sim"
    pending_node(sim)
    result = run("mig", "apply", "-c", "all-1g", *base(sim))  # stdin is not a terminal
    assert result.exit_code == 2
    assert "MIG mode" in result.stderr
    assert "--yes" in result.stderr
    assert pending(sim) == [False] * 8, "a refused apply changed MIG modes"


def test_the_agents_allow_reset_setting_does_not_reach_mig_apply(tmp_path: Path) -> None:
    sim = tmp_path / "sim"
    pending_node(sim)
    env = {"NODEAGENT_MIG_ALLOW_RESET": "true"}  # set for the agent in this shell
    result = run("mig", "apply", "-c", "all-1g", "--yes", *base(sim), env=env)
    assert result.exit_code == 1, result.output
    assert "reset required" in result.stdout
    assert pending(sim) == [True] * 8, "a GPU was reset without --allow-reset"
    again = run("mig", "apply", "-c", "all-1g", "--yes", "--allow-reset", *base(sim))
    assert again.exit_code == 0, again.output


def test_an_unusable_mig_state_dir_is_one_line_before_any_change(tmp_path: Path) -> None:
    sim = tmp_path / "sim"
    (tmp_path / "file").write_text("x")
    result = run(
        "mig", "apply", "-c", "all-1g", "--yes", "--allow-reset",
        "--mig-state-dir", str(tmp_path / "file" / "mig"), *base(sim),
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert "nothing was changed" in result.stderr
    assert pending(sim) == [False] * 8
    assert not any(g["mig_enabled"] for g in json.loads(run("gpus", "--json", *base(sim)).stdout))


@pytest.mark.parametrize("command", [["gpus"], ["processes"], ["mig", "show"], ["status"]])
def test_an_unusable_simulated_state_dir_is_one_line(tmp_path: Path, command: list[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = run(*command, "--simulate", "dgx-h100", "--state-dir", str(blocker / "sim"))
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert "cannot use the simulated node's state dir" in result.output
    assert "pass a writable --state-dir" in result.output
