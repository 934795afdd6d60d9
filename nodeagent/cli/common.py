"""Options and error handling shared by every command group.

Exit codes: 0 ok, 1 drift or failure found, 2 usage or environment error. Errors print one line
of cause and one line of hint on stderr, never a traceback.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from nodeagent.agent.backend import open_node, simulated_preset
from nodeagent.gpu.errors import DriverNotLoaded, GpuError

if TYPE_CHECKING:
    from nodeagent.config.errors import ConfigError
    from nodeagent.config.schema import AgentConfig
    from nodeagent.gpu.node import GpuNode

EXIT_OK = 0
EXIT_DRIFT = 1
EXIT_USAGE = 2

SimulateOption = Annotated[
    str | None,
    typer.Option(
        "--simulate",
        envvar="NODEAGENT_SIMULATE",
        help="Run against a simulated node of this preset (see `nodeagent sim presets`).",
        show_default=False,
    ),
]
StateDirOption = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        envvar="NODEAGENT_SIM_STATE",
        help="Simulator state directory (shared by every command on the same simulated node).",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", envvar="NODEAGENT_CONFIG", help="Agent config file."),
]
MigLockOption = Annotated[
    Path | None,
    typer.Option(
        "--mig-lock-file",
        envvar="NODEAGENT_MIG_LOCK_FILE",
        help="The node-wide MIG lock every MIG apply takes (default: /run/nodeagent/mig.lock; "
        "on a simulated node, mig.lock in its state directory).",
        show_default=False,
    ),
]
AgentStateDirOption = Annotated[
    Path | None,
    typer.Option(
        "--agent-state-dir",
        envvar="NODEAGENT_STATE_DIR",
        help="The agent's state directory (default: state_dir in the config; with --simulate "
        "and --state-dir, STATE_DIR/agent like `nodeagent run`).",
        show_default=False,
    ),
]


def finite(value: float | None) -> float | None:
    """Typer callback for a number of seconds: ``nan`` and ``inf`` pass every range check and
    then hang a wait or break a clock, so they are refused here."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number")
    return value


def fail(cause: str, hint: str, code: int = EXIT_USAGE) -> NoReturn:
    """Print a one-line cause and a one-line hint on stderr and exit with ``code``."""
    sys.stderr.write(f"error: {cause}\n")
    if hint:
        sys.stderr.write(f"hint: {hint}\n")
    raise typer.Exit(code)


CONFIG_HINT = "fix the file; `docs/config.md` lists every field and its default"


def fail_config(exc: ConfigError, hint: str = CONFIG_HINT) -> NoReturn:
    """Exit 2 listing every problem of a file (one ``error:`` line each), then one hint."""
    for problem in exc.problems:
        sys.stderr.write(f"error: {problem}\n")
    sys.stderr.write(f"hint: {hint}\n")
    raise typer.Exit(EXIT_USAGE)


def agent_state_dir(
    explicit: Path | None, simulate: str | None, sim_state: Path | None, config: Path | None
) -> Path:
    """Where a running agent keeps its state, resolved the way ``nodeagent run`` chooses it.

    A config named with ``-c`` is always read, so a wrong path is an error even where the
    other options decide the directory.
    """
    loaded = load_config_or_exit(config) if config is not None else None
    if explicit is not None:
        return explicit
    if sim_state is not None and simulating(simulate, sim_state):
        return sim_state / "agent"
    return (loaded or load_config_or_exit(None)).state_dir


def simulating(simulate: str | None, sim_state: Path | None) -> bool:
    """Whether the command runs on a simulated node: a preset is named, or the state directory
    holds a node (a damaged one too: opening the node then says what is wrong with it)."""
    try:
        return simulated_preset(simulate, state_dir=sim_state) is not None
    except GpuError:
        return True


def load_config_or_exit(config: Path | None) -> AgentConfig:
    """The agent config (file, env, defaults), or exit 2 listing every problem."""
    # Imported here: the config schema pulls in YAML and every section, which the commands
    # that never read the agent's config should not pay for at start (bench/cli_startup.py).
    from nodeagent.config.errors import ConfigError
    from nodeagent.config.schema import load_agent_config

    try:
        return load_agent_config(config)
    except ConfigError as exc:
        fail_config(exc)


def open_node_or_exit(simulate: str | None, state_dir: Path | None) -> GpuNode:
    """Open the node's GPUs or exit 2 with the cause and the ``--simulate`` hint."""
    try:
        return open_node(simulate=simulate, state_dir=state_dir)
    except DriverNotLoaded as exc:
        # The message already names the fix (--simulate and the presets): one line is enough.
        fail(str(exc), "")
    except ValueError as exc:  # a bad --simulate/--state-dir; the message names the choices
        fail(str(exc), "")
    except OSError as exc:  # the simulated node's state dir cannot be made or read
        where = exc.filename or state_dir
        fail(
            f"cannot use the simulated node's state dir: {where}: {exc.strerror or exc}",
            "pass a writable --state-dir (env NODEAGENT_SIM_STATE)",
        )
    except GpuError as exc:
        simulated = simulating(simulate, state_dir)
        fail(str(exc), "" if simulated else "check the NVIDIA driver and GPUs with `nvidia-smi`")


GIB = 1024**3


def gib(n_bytes: float, decimals: int = 1) -> str:
    """A byte count in GiB for a table cell (``"79.6"``); the caller adds the unit."""
    return f"{n_bytes / GIB:.{decimals}f}"


def emit_json(data: Any) -> None:
    """Print ``data`` as indented JSON on stdout."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    """An aligned plain-text table (no colours, so output pipes cleanly), newline-terminated."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines) + "\n"


def print_table(headers: list[str], rows: list[list[str]]) -> None:
    """Print :func:`format_table` on stdout."""
    sys.stdout.write(format_table(headers, rows))
