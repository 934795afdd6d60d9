"""The ``nodeagent`` entry point: mounts every command group."""

from __future__ import annotations

from typing import Annotated

import typer

from nodeagent import __version__
from nodeagent.cli import gpus, install, run, status
from nodeagent.cli.health import app as health_app
from nodeagent.cli.mig import app as mig_app
from nodeagent.cli.sim import app as sim_app
from nodeagent.cli.tiering import app as tiering_app

app = typer.Typer(
    name="nodeagent",
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


app.command("gpus")(gpus.gpus)
app.command("topo")(gpus.topo)
app.command("run")(run.run)
app.command("status")(status.status)
app.command("install-systemd")(install.install_systemd)
app.add_typer(health_app, name="health", help="GPU health, reasons, actions and node stability.")
app.add_typer(mig_app, name="mig", help="MIG layouts: plan, apply, assert, show, export.")
app.add_typer(
    tiering_app, name="tiering", help="The central tiering service: run, report, reset-breaker."
)
app.add_typer(sim_app, name="sim", help="The simulated node: presets, faults, processes.")


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
