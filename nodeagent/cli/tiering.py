"""``nodeagent tiering``: the central tiering service and the pool review.

- ``run``: assign tiers and drain unstable nodes (leader-elected; ``--dry-run`` changes nothing);
- ``report``: the pool review as a table, ``--json`` or a self-contained ``--html`` page;
- ``reset-breaker``: close the circuit breaker after an operator has looked at the cause;
- ``why-pending``: why each pending GPU pod waits, and the smallest change that unblocks it;
- ``simulate``: one pass of the service over a cluster file, without any cluster.
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

from nodeagent.agent.mig_planning import plan_for_diagnosis
from nodeagent.cli.common import EXIT_OK, JsonOption, emit_json, fail, fail_config, print_table
from nodeagent.config.errors import ConfigError

app = typer.Typer(
    name="tiering",
    help="Node tiers from capabilities and health; safe drains of unstable nodes; why GPU "
    "workloads are pending; pool review.",
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
        planner=plan_for_diagnosis,
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
    namespace: NamespaceOption = "nodeagent",
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
    now = time.time()
    review = build_review(
        nodes,
        events,
        policy=policy,
        now_s=now,
        period_s=period_days * 86400,
        prometheus=values,
    )
    review.sections.append(_fragmentation(kube, namespace, policy, now, period_days * 86400))
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
        for section in review.sections:
            for title, headers, rows in section.tables:
                sys.stdout.write(f"\n{title}\n")
                if rows:
                    print_table(headers, rows)
                else:
                    sys.stdout.write("(none)\n")


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


def _fragmentation(kube: Any, namespace: str, policy: Any, now: float, period_s: float) -> Any:
    """The review's fragmentation section: the service's history plus a live pass."""
    from nodeagent_tiering.history import (
        History,
        HistoryStore,
        fragmentation_section,
        section_tables,
    )
    from nodeagent_tiering.kube import KubeError
    from nodeagent_tiering.pending import Diagnoser, settings_for
    from nodeagent_tiering.report import Section

    notes = []
    store = HistoryStore(kube, namespace)
    try:
        history = store.load()
    except KubeError as exc:
        history = History()
        notes.append(f"history unavailable: {exc}")
    current = None
    try:
        current = Diagnoser(_live_view(kube), settings_for(policy), plan_for_diagnosis).run()
    except KubeError as exc:
        notes.append(f"live pass unavailable: {exc}")
    section = fragmentation_section(history, now_s=now, period_s=period_s, current=current)
    data = {**section.to_json(), "source": f"ConfigMap {namespace}/{store.name}, live pass"}
    if notes:
        data["note"] = "; ".join(notes)
    return Section("fragmentation", "Fragmentation", data, tuple(section_tables(section)))


def _live_view(kube: Any) -> Any:
    """Nodes, pods and (when Kueue is installed) Workloads, listed once. Raises KubeError."""
    from nodeagent_tiering.view import view_from_objects

    workloads = kube.list_workloads()
    return view_from_objects(
        kube.list_nodes().get("items") or [],
        kube.list_pods().get("items") or [],
        None if workloads is None else workloads.get("items") or [],
    )


PENDING_HEADERS = ["POD", "REQUEST", "REASON", "EVIDENCE", "SMALLEST UNBLOCKING CHANGE"]


def _pending_rows(result: Any) -> list[list[str]]:
    return [
        [
            d.pod,
            ", ".join(f"{n} {r}" for r, n in sorted(d.request.items())),
            d.reason.value,
            d.evidence,
            d.unblock.text if d.unblock is not None else "-",
        ]
        for d in result.diagnoses
    ]


@app.command("why-pending")
def why_pending_command(
    pod: Annotated[
        str | None, typer.Argument(help="One pod (in --namespace, default `default`).")
    ] = None,
    namespace: Annotated[
        str | None,
        typer.Option("--namespace", "-n", help="Only pods of this namespace.", show_default=False),
    ] = None,
    policy_file: Annotated[
        Path | None,
        typer.Option(
            "--policy",
            envvar="NODEAGENT_TIERING_POLICY",
            help="Tier policy (its drain taint and pending.topology_key).",
            show_default=False,
        ),
    ] = None,
    as_json: JsonOption = False,
    kubeconfig: KubeconfigOption = None,
    server: ServerOption = None,
    in_cluster: InClusterOption = False,
) -> None:
    """Why each pending GPU pod waits, and the smallest change that would unblock it."""
    from nodeagent_tiering.kube import KubeError
    from nodeagent_tiering.pending import Diagnoser, PassResult, settings_for

    policy = _policy(policy_file) if policy_file else None
    api, kube_cls = _client(server, kubeconfig, in_cluster)
    kube = kube_cls(api)
    try:
        view = _live_view(kube)
    except KubeError as exc:
        fail(str(exc), "check --server/--kubeconfig and that the API server is reachable")
    if pod is not None and namespace is None:
        namespace = "default"
    diagnoser = Diagnoser(view, settings_for(policy), plan_for_diagnosis)
    chosen = [
        p
        for p in diagnoser.pending()
        if (namespace is None or p.namespace == namespace) and (pod is None or p.name == pod)
    ]
    result = PassResult(tuple(diagnoser.diagnose(p) for p in chosen), diagnoser.stats(()))
    if pod is not None and not chosen:
        found = next((p for p in view.pods if (p.namespace, p.name) == (namespace, pod)), None)
        if found is None:
            fail(f"no pod {namespace}/{pod}", "check the name and -n NAMESPACE")
        if not as_json:
            where = f" on node {found.node_name}" if found.node_name else ""
            what = "requests no GPU" if not found.requests else f"is {found.phase}{where}"
            sys.stdout.write(f"{namespace}/{pod} is not a pending GPU pod: it {what}\n")
            raise typer.Exit(EXIT_OK)
    if as_json:
        emit_json(result.to_json())
    elif result.diagnoses:
        print_table(PENDING_HEADERS, _pending_rows(result))
    else:
        sys.stdout.write("no pending GPU pods\n")


@app.command("simulate")
def simulate_command(
    cluster_file: Annotated[
        Path,
        typer.Option("--cluster", help="Cluster file (version: v1; see docs/tiering.md)."),
    ],
    policy_file: Annotated[
        Path | None,
        typer.Option(
            "--policy",
            envvar="NODEAGENT_TIERING_POLICY",
            help="Tier policy: plan tiers and drains first, as the service would.",
            show_default=False,
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """One pass of the service over a simulated cluster: what it would do, why pods wait."""
    import tempfile

    from nodeagent.agent.simulated import SimulatedCluster, SimulationError
    from nodeagent_tiering.clusterfile import ClusterFileError, load_cluster
    from nodeagent_tiering.simulate import simulate

    try:
        cluster = load_cluster(cluster_file)
    except ClusterFileError as exc:
        fail(str(exc), 'fix the cluster file (docs/tiering.md, "Try it without a cluster")')
    policy = _policy(policy_file) if policy_file else None
    with tempfile.TemporaryDirectory(prefix="nodeagent-simulate-") as workdir:
        try:
            simulated = SimulatedCluster(cluster, cluster_file.parent, Path(workdir))
        except SimulationError as exc:
            fail(f"{cluster_file}: {exc}", "fix the cluster file (docs/tiering.md)")
        outcome = simulate(
            simulated.node_objects(),
            simulated.pod_objects(),
            simulated.workload_objects(),
            policy,
            plan_for_diagnosis,
            now_s=time.time(),
        )
    if as_json:
        emit_json(outcome.to_json())
        return
    for line in outcome.actions:
        sys.stdout.write(f"would {line}\n")
    if outcome.actions:
        sys.stdout.write("\n")
    if outcome.result.diagnoses:
        print_table(PENDING_HEADERS, _pending_rows(outcome.result))
    else:
        sys.stdout.write("no pending GPU pods\n")
