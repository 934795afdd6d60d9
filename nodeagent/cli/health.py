"""``nodeagent health``: per-GPU state, reasons, actions and the node's stability score.

It reads the state file a running agent writes. With ``--simulate`` and no running agent it
evaluates the node once itself (snapshot checks plus the remembered history; XIDs are events and
only a running agent sees them). Exit code 1 when a GPU is unhealthy or lost or the node is
unstable, so scripts can gate on it.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import typer

from nodeagent.atomicfile import StateFileError
from nodeagent.cli.common import (
    EXIT_DRIFT,
    EXIT_OK,
    AgentStateDirOption,
    ConfigOption,
    JsonOption,
    SimulateOption,
    StateDirOption,
    emit_json,
    fail,
    fail_config,
    open_node_or_exit,
    print_table,
    simulating,
)
from nodeagent.cli.common import (
    agent_state_dir as resolve_agent_state,
)
from nodeagent.health.model import HealthModel
from nodeagent.health.statefile import history_path, read_status, status_path, to_json

app = typer.Typer(help="GPU health, reasons, recommended actions and node stability.")


def _pid_alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else (the agent runs as root)
    return True


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _evaluate(
    simulate: str | None, sim_state: Path | None, agent_state: Path, config: Path | None
) -> dict[str, Any]:
    """Check the node once: one snapshot through the model, history read but not written."""
    from nodeagent.config.errors import ConfigError
    from nodeagent.config.schema import load_health_settings

    try:
        cfg = load_health_settings(config)
    except ConfigError as exc:
        fail_config(exc)
    node = open_node_or_exit(simulate, sim_state)
    try:
        model = HealthModel(
            cfg.health,
            expected_driver=cfg.expected_driver_version,
            history_path=history_path(agent_state),
            status_path=status_path(agent_state),
            read_only=True,  # a one-shot look must not rewrite or move the agent's files
        )
        model.on_snapshot(node.snapshot())
        data = to_json(model.node_health(), cfg.node_name)
    finally:
        node.close()
    data["source"] = "evaluated"
    return data


def _print(data: dict[str, Any]) -> None:
    stab = data["stability"]
    flap = ", flapping" if stab["flapping"] else ""
    age = time.time() - float(data["timestamp_s"])
    source = data.get("source", "agent")
    stale = "  (STALE: agent not running)" if data.get("stale") else ""
    sys.stdout.write(
        f"node {data['node']}: health {data['health']}, stability {stab['level']} "
        f"(score {stab['score']:.1f}{flap}), driver {data.get('driver_version') or '?'}, "
        f"{source} {_age(age)} ago{stale}\n"
    )
    rows = []
    for dev in data["devices"]:
        name = f"{dev['gpu']}" if dev["parent"] is None else f"{dev['gpu']}/mig"
        since = _age(time.time() - float(dev["since_s"]))
        reasons = "; ".join(dev["reasons"]) or "-"
        rows.append([name, dev["uuid"], dev["state"], dev["action"], since, reasons])
    print_table(["GPU", "UUID", "STATE", "ACTION", "SINCE", "REASONS"], rows)


@app.callback(invoke_without_command=True)
def health(
    as_json: JsonOption = False,
    simulate: SimulateOption = None,
    state_dir: StateDirOption = None,
    agent_state_dir: AgentStateDirOption = None,
    config: ConfigOption = None,
) -> None:
    """Show each GPU's health state, reasons and action, and the node's stability score."""
    agent_state = resolve_agent_state(agent_state_dir, simulate, state_dir, config)
    try:
        data = read_status(agent_state)
    except StateFileError as exc:
        # One line: the message names the path and the fix (a directory: remove it); the
        # running agent writes the file again at its next report.
        fail(f"{exc}; a running agent then writes it again at its next report", "")
    except ValueError as exc:
        fail(str(exc), "delete the file; a running agent rewrites it within a minute")
    running = data is not None and _pid_alive(data.get("pid"))
    if not running:
        if simulating(simulate, state_dir):
            data = _evaluate(simulate, state_dir, agent_state, config)
        elif data is None:
            fail(
                f"no health status at {status_path(agent_state)}",
                "start the agent (`nodeagent run`), pass --agent-state-dir, or use --simulate "
                "PRESET to check a simulated node once",
            )
        else:
            data["stale"] = True
    assert data is not None
    if as_json:
        emit_json(data)
    else:
        _print(data)
    bad = data["health"] in ("unhealthy", "lost") or data["stability"]["level"] == "unstable"
    raise typer.Exit(EXIT_DRIFT if bad else EXIT_OK)
