"""``nodeagent dra``: the DRA driver seen without a cluster."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
import yaml

from nodeagent.cli.common import (
    ConfigOption,
    JsonOption,
    SimulateOption,
    StateDirOption,
    emit_json,
    fail,
    load_config_or_exit,
    open_node_or_exit,
)
from nodeagent.config.types import kube_node_name

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


@app.command()
def slices(
    simulate: SimulateOption = None,
    state_dir: StateDirOption = None,
    config: ConfigOption = None,
    dynamic_mig: Annotated[
        bool | None,
        typer.Option(
            "--dynamic-mig/--no-dynamic-mig",
            help="Offer every MIG placement (default: the pool's dra.dynamic_mig).",
            show_default=False,
        ),
    ] = None,
    node_name: Annotated[
        str | None,
        typer.Option("--node-name", help="The node (default: the config's node name)."),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Print the ResourceSlices the agent would publish for this node, exactly as sent.

    YAML documents by default, a JSON list with --json. Devices the driver prepared (read from
    its checkpoint in the agent's state directory) are shown as the agent shows them, and health
    (the agent's health history, then this snapshot) taints devices as the agent does.
    """
    from nodeagent.health.component import build_model
    from nodeagent_dra.checkpoint import read_managed
    from nodeagent_dra.slices import build_slices, slice_spec

    if node_name is not None:
        try:
            kube_node_name(node_name)
        except ValueError as exc:
            fail(str(exc), "pass --node-name as the node is named in the cluster")
    cfg = load_config_or_exit(config)
    node = open_node_or_exit(simulate, state_dir)
    try:
        snapshot = node.snapshot()
    finally:
        node.close()
    # The driver's health input as the agent holds it: the model restored from the agent's
    # history, then this snapshot (a GPU lost now is lost here too); read-only, so the look
    # never rewrites the running agent's files.
    health = build_model(cfg, read_only=True)
    if health is not None:
        health.on_snapshot(snapshot)
    spec = slice_spec(
        cfg,
        health,
        managed=read_managed(cfg.state_dir),
        node_name=node_name,
        dynamic_mig=dynamic_mig,
    )
    published = build_slices(snapshot, spec).slices
    if spec.dynamic_mig:
        off = [
            str(g.info.index)
            for g in snapshot.gpus
            if g.info.mig_capable and not g.info.mig_enabled
        ]
        if off:
            sys.stderr.write(
                f"note: MIG is off on GPU {', '.join(off)}: dynamic MIG offers placements only "
                "where MIG is on (pool mig_layout all-enabled, or `nodeagent mig apply`)\n"
            )
    if as_json:
        emit_json(list(published))
    else:
        sys.stdout.write(yaml.safe_dump_all(list(published), sort_keys=False))
