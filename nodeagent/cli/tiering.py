"""``nodeagent tiering``: the central tiering service and the pool review.

- ``run``: assign tiers and drain unstable nodes (leader-elected; ``--dry-run`` changes nothing);
- ``report``: the pool review as a table, ``--json`` or a self-contained ``--html`` page;
- ``reset-breaker``: close the circuit breaker after an operator has looked at the cause.
"""

from __future__ import annotations

import logging
import socket
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from nodeagent.cli.common import EXIT_OK, JsonOption, emit_json, fail, fail_config, print_table
from nodeagent.config.errors import ConfigError

app = typer.Typer(
    name="tiering",
    help="Node tiers from capabilities and health; safe drains of unstable nodes; pool review.",
    no_args_is_help=True,
)

KubeconfigOption = Annotated[
    Path | None,
    typer.Option(
        "--kubeconfig",
        envvar="NODEAGENT_TIERING_KUBECONFIG",
        help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config).",
        show_default=False,
    ),
]
ServerOption = Annotated[
    str | None,
    typer.Option(
        "--server",
        envvar="NODEAGENT_TIERING_SERVER",
        help="API server URL (alone: no authentication, for local stand-ins and proxies).",
        show_default=False,
    ),
]
InClusterOption = Annotated[
    bool,
    typer.Option(
        "--in-cluster",
        envvar="NODEAGENT_TIERING_IN_CLUSTER",
        help="Use the pod's service account (what the Deployment does).",
    ),
]
NamespaceOption = Annotated[
    str,
    typer.Option(
        "--namespace",
        envvar="NODEAGENT_TIERING_NAMESPACE",
        help="Namespace of the Lease and of the Events the service records.",
    ),
]
LeaseOption = Annotated[
    str,
    typer.Option("--lease-name", envvar="NODEAGENT_TIERING_LEASE", help="Name of the Lease."),
]
PolicyOption = Annotated[
    Path,
    typer.Option(
        "--policy", envvar="NODEAGENT_TIERING_POLICY", help="Tier policy file (version: v1)."
    ),
]


def _client(server: str | None, kubeconfig: Path | None, in_cluster: bool) -> Any:
    from nodeagent_tiering.kube import Kube, api_client

    try:
        api = api_client(server=server, kubeconfig=kubeconfig, in_cluster=in_cluster)
    except Exception as exc:  # noqa: BLE001 - the client raises many kinds for bad config
        fail(
            f"cannot configure Kubernetes access: {exc}",
            "pass --server URL, --kubeconfig FILE or --in-cluster",
        )
    return api, Kube


def _policy(path: Path) -> Any:
    from nodeagent_tiering.policy import load_policy

    try:
        return load_policy(path)
    except ConfigError as exc:
        fail_config(exc, f"fix the tier policy file {path} (see docs/tiering.md)")


@app.command("run")
def run_command(
    policy_file: PolicyOption,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            envvar="NODEAGENT_TIERING_DRY_RUN",
            help="Log what would change; write nothing (no labels, drains, events or lease).",
        ),
    ] = False,
    once: Annotated[
        bool,
        typer.Option("--once", help="One reconcile pass, print what it did (or would do), exit."),
    ] = False,
    kubeconfig: KubeconfigOption = None,
    server: ServerOption = None,
    in_cluster: InClusterOption = False,
    namespace: NamespaceOption = "nodeagent",
    lease_name: LeaseOption = "nodeagent-tiering",
    identity: Annotated[
        str | None,
        typer.Option(
            "--identity",
            envvar="POD_NAME",
            help="Leader-election identity (default: pod name, else hostname).",
            show_default=False,
        ),
    ] = None,
    metrics_address: Annotated[
        str | None,
        typer.Option(
            "--metrics-address",
            envvar="NODEAGENT_TIERING_METRICS_ADDRESS",
            help="Serve the service's metrics on HOST:PORT.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Assign tiers and drain unstable nodes within the disruption budget."""
    from nodeagent_tiering import service as tiering
    from nodeagent_tiering.kube import KubeError

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    policy = _policy(policy_file)
    api, _ = _client(server, kubeconfig, in_cluster)
    service = tiering.build(
        api,
        policy,
        namespace=namespace,
        lease_name=lease_name,
        identity=identity or socket.gethostname(),
        dry_run=dry_run,
    )
    if once:
        try:
            result = tiering.run_once(service)
        except KubeError as exc:
            fail(str(exc), "check --server/--kubeconfig and that the API server is reachable")
        except tiering.LeaseHeldError:
            fail(
                f"another replica holds the lease {namespace}/{lease_name}",
                "use --dry-run to see what would change, or stop the running service first",
            )
        for line in service.controller.dry_log.lines:
            sys.stdout.write(f"would {line}\n")
        if not dry_run:
            sys.stdout.write(f"{len(result.actions)} actions\n")
        raise typer.Exit(EXIT_OK)
    host, port = None, None
    if metrics_address:
        host, _, raw_port = metrics_address.rpartition(":")
        if not raw_port.isdigit():
            fail(f"--metrics-address {metrics_address!r} is not HOST:PORT", "e.g. 0.0.0.0:9402")
        port = int(raw_port)
    tiering.serve(service, host, port)


@app.command("report")
def report_command(
    policy_file: Annotated[
        Path | None,
        typer.Option(
            "--policy",
            envvar="NODEAGENT_TIERING_POLICY",
            help="Tier policy (gives tier order and expected drivers).",
            show_default=False,
        ),
    ] = None,
    prometheus: Annotated[
        str | None,
        typer.Option(
            "--prometheus",
            envvar="NODEAGENT_TIERING_PROMETHEUS",
            help="Prometheus URL for fragmentation and stranded capacity (else node annotations).",
            show_default=False,
        ),
    ] = None,
    node_label: Annotated[
        str,
        typer.Option("--node-label", help="Prometheus target label that names the node."),
    ] = "node",
    period_days: Annotated[
        float, typer.Option("--period-days", help="Count drains over this many days.")
    ] = 30.0,
    as_json: JsonOption = False,
    html_file: Annotated[
        Path | None,
        typer.Option("--html", help="Write a self-contained HTML page here.", show_default=False),
    ] = None,
    kubeconfig: KubeconfigOption = None,
    server: ServerOption = None,
    in_cluster: InClusterOption = False,
) -> None:
    """The pool review per tier: health, drift, MIG layouts, fragmentation, drains."""
    from nodeagent_tiering.kube import KubeError
    from nodeagent_tiering.nodes import NodeView
    from nodeagent_tiering.report import (
        TABLE_HEADERS,
        ReportError,
        build_review,
        query_prometheus,
        render_html,
        table_rows,
    )

    policy = _policy(policy_file) if policy_file else None
    api, kube_cls = _client(server, kubeconfig, in_cluster)
    kube = kube_cls(api)
    try:
        nodes = [NodeView.from_object(o) for o in kube.list_nodes().get("items") or []]
        events = kube.list_events()
        values = query_prometheus(prometheus, node_label) if prometheus else None
    except KubeError as exc:
        fail(str(exc), "check --server/--kubeconfig and that the API server is reachable")
    except ReportError as exc:
        fail(str(exc), "check --prometheus (e.g. http://prometheus:9090)")
    review = build_review(
        nodes,
        events,
        policy=policy,
        now_s=time.time(),
        period_s=period_days * 86400,
        prometheus=values,
    )
    if html_file is not None:
        stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        try:
            html_file.write_text(render_html(review, generated=stamp))
        except OSError as exc:
            fail(f"cannot write {html_file}: {exc.strerror}", "pick a writable path for --html")
    if as_json:
        emit_json(review.to_json())
    else:
        print_table(TABLE_HEADERS, table_rows(review))


@app.command("reset-breaker")
def reset_breaker_command(
    kubeconfig: KubeconfigOption = None,
    server: ServerOption = None,
    in_cluster: InClusterOption = False,
    namespace: NamespaceOption = "nodeagent",
    lease_name: LeaseOption = "nodeagent-tiering",
) -> None:
    """Close the circuit breaker; the leader resumes drains at its next renewal."""
    from nodeagent_tiering.kube import KubeError
    from nodeagent_tiering.leader import reset_breaker_on_lease

    api, kube_cls = _client(server, kubeconfig, in_cluster)
    try:
        done = reset_breaker_on_lease(kube_cls(api), namespace, lease_name, now_s=time.time())
    except KubeError as exc:
        fail(str(exc), "retry; a 409 means the leader renewed at the same moment")
    if not done:
        fail(
            f"no lease {namespace}/{lease_name}",
            "is the service running? check --namespace and --lease-name",
        )
    sys.stdout.write("circuit breaker closed\n")
