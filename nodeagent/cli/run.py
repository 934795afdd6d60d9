"""``nodeagent run``: the agent daemon."""

from __future__ import annotations

import logging
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from nodeagent.agent.backend import host_root, mig_lock_file
from nodeagent.agent.daemon import Agent, StartupError
from nodeagent.cli.common import (
    MigLockOption,
    SimulateOption,
    StateDirOption,
    fail,
    fail_config,
    open_node_or_exit,
    simulating,
)
from nodeagent.config.errors import ConfigError
from nodeagent.config.schema import check_gpu_indices, load_agent_config


class LogLevel(StrEnum):
    """The agent's log levels (a typo must not quietly mean info)."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


def run(
    config: Annotated[
        Path | None,
        typer.Option(
            "--config", "-c", envvar="NODEAGENT_CONFIG", help="Agent config file (version: v1)."
        ),
    ] = None,
    simulate: SimulateOption = None,
    state_dir: StateDirOption = None,
    agent_state_dir: Annotated[
        Path | None,
        typer.Option(
            "--agent-state-dir",
            help="Where the agent keeps health history and MIG intent "
            "(default: state_dir in the config, /var/lib/nodeagent).",
        ),
    ] = None,
    kubelet_dir: Annotated[
        Path | None,
        typer.Option("--kubelet-dir", help="Device-plugin directory holding kubelet.sock."),
    ] = None,
    metrics_address: Annotated[
        str | None,
        typer.Option("--metrics-address", help="Serve /metrics on HOST:PORT."),
    ] = None,
    mig_lock: MigLockOption = None,
    log_level: Annotated[
        LogLevel,
        typer.Option("--log-level", envvar="NODEAGENT_LOG_LEVEL", case_sensitive=False),
    ] = LogLevel.INFO,
) -> None:
    """Run the agent: sampler, MIG reconciler, health, device plugin and metrics."""
    logging.basicConfig(
        level=getattr(logging, log_level.value.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # Flags are config overrides: they win over env and file, survive SIGHUP reloads, and
    # show in the effective config the agent logs.
    overrides: dict[str, Any] = {}
    if kubelet_dir is not None:
        overrides["device_plugin"] = {"kubelet_dir": str(kubelet_dir)}
    if metrics_address is not None:
        overrides["metrics"] = {"address": metrics_address}
    if agent_state_dir is not None:
        overrides["state_dir"] = str(agent_state_dir)
    elif state_dir is not None and simulating(simulate, state_dir):
        # A simulated node keeps the agent's state beside the simulator's, so one directory
        # holds the whole demo and nothing is written under /var/lib.
        overrides["state_dir"] = str(state_dir / "agent")
    try:
        agent_config = load_agent_config(config, overrides=overrides)
    except ConfigError as exc:
        fail_config(exc)
    node = open_node_or_exit(simulate, state_dir)
    try:
        check_gpu_indices(agent_config, node.count(), config)
    except ConfigError as exc:
        node.close()
        fail_config(exc, "name GPUs this node has (`nodeagent gpus` lists them)")
    agent = Agent(
        agent_config,
        node,
        config_path=config,
        config_overrides=overrides,
        mig_lock_file=mig_lock_file(simulate, state_dir, mig_lock),
        host_root=host_root(simulate, state_dir),
    )
    try:
        code = agent.serve()
    except StartupError as exc:
        node.close()
        fail(str(exc), exc.hint)
    raise typer.Exit(code)
