"""``nodeagent install-systemd``: install the systemd units and a default config.

Thin over :mod:`nodeagent.installer`, which renders the units for a root and a binary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nodeagent.cli.common import emit_json, fail
from nodeagent.installer import Layout, default_prefix, install


def install_systemd(
    root: Annotated[
        Path,
        typer.Option(
            "--root",
            help="Install under this directory instead of / (units name paths under it too).",
        ),
    ] = Path("/"),
    prefix: Annotated[
        Path | None,
        typer.Option(
            "--prefix",
            help="Prefix whose bin/nodeagent the units run (default: this installation's).",
            show_default=False,
        ),
    ] = None,
    simulate: Annotated[
        str | None,
        typer.Option(
            "--simulate",
            help="Also install drop-ins that run the units on a simulated node of this preset.",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
) -> None:
    """Install the systemd units and a default config (an existing config is kept)."""
    root = root.absolute()
    if root.exists() and not root.is_dir():
        fail(f"--root {root} is not a directory", "pass a directory, or omit --root to use /")
    binary = (prefix.absolute() if prefix else default_prefix()) / "bin" / "nodeagent"
    if not binary.is_file():
        fail(
            f"{binary} does not exist",
            "pass --prefix DIR where DIR/bin/nodeagent is the installed command",
        )
    if simulate is not None:
        from nodeagent.agent.backend import preset_names

        if simulate not in preset_names():
            fail(
                f"unknown simulator preset {simulate!r}",
                f"choose one of: {', '.join(preset_names())}",
            )
    layout = Layout(root=root, binary=binary)
    try:
        result = install(layout, simulate=simulate)
    except PermissionError as exc:
        fail(f"{exc.strerror}: {exc.filename}", "run as root, or pass --root DIR to rehearse")
    except IsADirectoryError as exc:
        fail(
            f"{exc.filename} is not a config file (a directory or other file is in its place)",
            "move it away; install then writes the default config there",
        )
    except OSError as exc:
        if exc.filename is None:  # the package's own unit files are missing
            fail(str(exc), "install nodeagent from a source checkout or a wheel that ships them")
        what = "a file is in its place" if isinstance(exc, FileExistsError) else exc.strerror
        fail(f"cannot create {exc.filename}: {what}", "pass --root a directory it can write")
    if as_json:
        emit_json(
            {
                "root": str(root),
                "binary": str(binary),
                "written": [str(p) for p in result.written],
                "kept": [str(p) for p in result.kept],
                "notes": list(result.notes),
            }
        )
        return
    for path in result.written:
        typer.echo(f"wrote {path}")
    for path in result.kept:
        typer.echo(f"kept  {path} (existing config is never overwritten)")
    for note in result.notes:
        typer.echo(f"note: {note}")
    if root == Path("/"):
        typer.echo(
            "next: systemctl daemon-reload && systemctl enable --now "
            "nodeagent-mig-ready.target nodeagent.service"
        )


app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
app.command("install-systemd")(install_systemd)

if __name__ == "__main__":
    app()
