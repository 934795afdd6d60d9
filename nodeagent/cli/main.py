"""The ``nodeagent`` entry point: mounts every command group.

Command modules are imported when their command runs, not at start: ``nodeagent gpus`` must not
pay for the Kubernetes client, gRPC and the agent's wiring that ``nodeagent run`` needs (about a
second on a small VM; bench/cli_startup.py measures it). ``--help`` imports them all to list
them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Annotated

import typer
from typer.core import TyperGroup

from nodeagent import __version__

if TYPE_CHECKING:  # typer carries its own click; only its types are needed here
    from typer._click import Command, Context

# name -> (module, attribute, help): a typer app (a group) or a function (one command).
COMMANDS: dict[str, tuple[str, str, str | None]] = {
    "gpus": ("nodeagent.cli.gpus", "gpus", None),
    "topo": ("nodeagent.cli.gpus", "topo", None),
    "run": ("nodeagent.cli.run", "run", None),
    "status": ("nodeagent.cli.status", "status", None),
    "processes": ("nodeagent.cli.processes", "processes", None),
    "install-systemd": ("nodeagent.cli.install", "install_systemd", None),
    "health": (
        "nodeagent.cli.health",
        "app",
        "GPU health, reasons, actions and node stability.",
    ),
    "mig": ("nodeagent.cli.mig", "app", "MIG layouts: plan, apply, assert, show, export."),
    "tiering": (
        "nodeagent.cli.tiering",
        "app",
        "The central tiering service: run, report, reset-breaker.",
    ),
    "sim": ("nodeagent.cli.sim", "app", "The simulated node: presets, faults, processes."),
    "dra": ("nodeagent.cli.dra", "app", "The DRA driver: the ResourceSlices this node publishes."),
}


class LazyGroup(TyperGroup):
    """A command group that imports a command's module only when that command is asked for."""

    def list_commands(self, ctx: Context) -> list[str]:
        """Every command, in the order of :data:`COMMANDS` (no import)."""
        return list(COMMANDS)

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        """The click command ``cmd_name``, built from its module on first use.

        Mounted on a throwaway app exactly as an eager ``app.command`` / ``app.add_typer``
        would mount it, so options, help and exit codes are the same.
        """
        if cmd_name not in COMMANDS:
            return None
        module, attribute, help_text = COMMANDS[cmd_name]
        target = getattr(importlib.import_module(module), attribute)
        mount = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
        mount.callback()(lambda: None)  # a group, so the command is found under its name
        if isinstance(target, typer.Typer):
            mount.add_typer(target, name=cmd_name, help=help_text)
        else:
            mount.command(cmd_name)(target)
        group = typer.main.get_command(mount)
        assert isinstance(group, TyperGroup)
        return group.commands[cmd_name]


app = typer.Typer(
    name="nodeagent",
    cls=LazyGroup,
    help="Node-level GPU sharing and health agent: MIG, device plugin, health and metrics.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"nodeagent {__version__}")
        raise typer.Exit(0)


@app.callback()
def main_callback(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Node-level GPU sharing and health agent."""


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
