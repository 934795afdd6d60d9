"""``nodeagent tiering``: the central tiering service and the pool review.

- ``run``: assign tiers and drain unstable nodes (leader-elected; ``--dry-run`` changes nothing);
- ``report``: the pool review as a table, ``--json`` or a self-contained ``--html`` page;
- ``why-pending``: why each pending GPU pod waits, and the smallest change that unblocks it;
- ``simulate``: one pass of the service over a cluster file, without any cluster;
- ``reset-breaker``: close the circuit breaker after an operator has looked at the cause;
- ``quota render|check|flavors``: the quota policy as Kueue objects, checked against the
  cluster's healthy capacity; the tiers' ResourceFlavors.
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
from nodeagent.cli.common import (
    EXIT_DRIFT,
    EXIT_OK,
    EXIT_USAGE,
    JsonOption,
    emit_json,
    fail,
    fail_config,
    print_table,
)
from nodeagent.config.errors import ConfigError
from nodeagent.config.types import dns_label, dns_subdomain

app = typer.Typer(
    name="tiering",
    help="Node tiers from capabilities and health; safe drains of unstable nodes; why GPU "
    "workloads are pending; team quotas on Kueue; pool review.",
    no_args_is_help=True,
)

KubeconfigOption = Annotated[
    Path | None,
    typer.Option(
        "--kubeconfig",
        envvar="NODEAGENT_TIERING_KUBECONFIG",
        help="kubeconfig file (default: $KUBECONFIG, in a pod its ServiceAccount, else "
        "~/.kube/config).",
        show_default=False,
    ),
]
ServerOption = Annotated[
    str | None,
    typer.Option(
        "--server",
        envvar="NODEAGENT_TIERING_SERVER",
        help="API server URL (alone: no authentication, for `kubectl proxy`).",
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
        help="Namespace of the Lease and of its Events (Events about nodes go to default).",
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


QuotaOption = Annotated[
    Path | None,
    typer.Option(
        "--quota",
        envvar="NODEAGENT_TIERING_QUOTA",
        help="Quota policy file (version: v1): tier flavor settings, teams and their quota.",
        show_default=False,
    ),
]


def _check_names(namespace: str, lease_name: str | None = None) -> None:
    """--namespace and --lease-name as the API server takes them, checked before anything
    starts: a bad name would otherwise surface as a 422 on the first write, after leadership."""
    try:
        dns_label(namespace, "namespace")
        if lease_name is not None:
            dns_subdomain(lease_name, 253, "Lease name")
    except ValueError as exc:
        fail(str(exc), "pass --namespace and --lease-name as the objects are named in the cluster")


def _client(server: str | None, kubeconfig: Path | None, in_cluster: bool) -> Any:
    from nodeagent_tiering.cluster.cluster_api import Kube, api_client

    try:
        api = api_client(server=server, kubeconfig=kubeconfig, in_cluster=in_cluster)
    except Exception as exc:  # noqa: BLE001 - the client raises many kinds for bad config
        fail(
            f"cannot configure Kubernetes access: {exc}",
            "pass --server URL, --kubeconfig FILE or --in-cluster",
        )
    return api, Kube


def _policy(path: Path) -> Any:
    from nodeagent_tiering.cluster.tier_policy import load_policy

    try:
        return load_policy(path)
    except ConfigError as exc:
        fail_config(exc, f"fix the tier policy file {path} (see docs/tiering.md)")


def _flavors(policy: Any, quota: Any) -> Any:
    """The tiers' desired flavors (the tier policy's tiers, else the quota policy's), or exit 2
    when two tiers would share a flavor name."""
    from nodeagent_tiering.quota.policy import flavors_of
    from nodeagent_tiering.quota.sync import service_flavors

    try:
        if policy is not None:
            return service_flavors(policy, quota)
        return flavors_of(quota) if quota is not None else []
    except ValueError as exc:
        fail(str(exc), "rename the tiers, or set flavor_prefix in the quota policy")


def _quota(path: Path, tier_policy: Any = None) -> Any:
    """The quota policy, checked against the tier policy's tiers when one is given."""
    from nodeagent_tiering.quota.policy import QuotaPolicyError, load_quota_policy

    tiers = [t.name for t in tier_policy.tiers] if tier_policy is not None else None
    try:
        return load_quota_policy(path, tiers=tiers)
    except QuotaPolicyError as exc:
        for line in str(exc).splitlines():
            sys.stderr.write(f"error: {line}\n")
        sys.stderr.write(f"hint: fix the quota policy {path} (see docs/tiering.md, Quotas)\n")
        raise typer.Exit(EXIT_USAGE) from None


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
    quota_file: QuotaOption = None,
    kueue: Annotated[
        bool,
        typer.Option(
            "--kueue/--no-kueue",
            envvar="NODEAGENT_TIERING_KUEUE",
            help="Keep the tiers as Kueue ResourceFlavors when the cluster serves Kueue.",
        ),
    ] = True,
) -> None:
    """Assign tiers and drain unstable nodes within the disruption budget."""
    from nodeagent_tiering import service as tiering
    from nodeagent_tiering.cluster.cluster_api import KubeError

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    _check_names(namespace, lease_name)
    policy = _policy(policy_file)
    quota = _quota(quota_file, policy) if quota_file is not None else None
    if kueue:
        _flavors(policy, quota)  # names valid, before anything starts
    api, _ = _client(server, kubeconfig, in_cluster)
    service = tiering.build(
        api,
        policy,
        namespace=namespace,
        lease_name=lease_name,
        identity=identity or socket.gethostname(),
        dry_run=dry_run,
        planner=plan_for_diagnosis,
        kueue=kueue,
        quota=quota,
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
        if dry_run and service.kueue is not None and service.kueue.api is not None:
            from nodeagent_tiering.quota.policy import render_yaml

            sys.stdout.write("# the ResourceFlavors the service keeps:\n")
            sys.stdout.write(render_yaml(service.kueue.objects()))
        if not dry_run:
            sys.stdout.write(f"{len(result.actions)} actions\n")
        raise typer.Exit(EXIT_OK)
    host, port = None, None
    if metrics_address:
        from nodeagent_exporters.server import parse_address  # the one HOST:PORT parser

        try:
            host, port = parse_address(metrics_address)
        except ValueError as exc:
            fail(str(exc), "pass --metrics-address HOST:PORT, e.g. 0.0.0.0:9402")
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
    quota_file: QuotaOption = None,
    prometheus: Annotated[
        str | None,
        typer.Option(
            "--prometheus",
            envvar="NODEAGENT_TIERING_PROMETHEUS",
            help="Prometheus URL: fragmentation, stranded capacity, GPU utilisation and memory "
            "per team (else node annotations, and no utilisation).",
            show_default=False,
        ),
    ] = None,
    node_label: Annotated[
        str,
        typer.Option("--node-label", help="Prometheus target label that names the node."),
    ] = "node",
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            help="The review's period: 30d, 12h, 90m (default: --period-days).",
            show_default=False,
        ),
    ] = None,
    period_days: Annotated[
        float, typer.Option("--period-days", help="The review's period in days.")
    ] = 30.0,
    prometheus_step: Annotated[
        str,
        typer.Option("--prometheus-step", help="Resolution of the utilisation averages."),
    ] = "5m",
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
    """The pool review: per tier health, drift, MIG layouts, fragmentation, drains; per tier
    and team quota, queue waits, utilisation and failures, and what to change."""
    from nodeagent_tiering.cluster.cluster_api import KubeError
    from nodeagent_tiering.cluster.units import parse_duration
    from nodeagent_tiering.review.build import build_pool_review
    from nodeagent_tiering.review.prometheus import ReportError
    from nodeagent_tiering.review.render import TABLE_HEADERS, render_html, table_rows

    try:
        period_s = parse_duration(since if since is not None else f"{period_days}d")
        step_s = parse_duration(prometheus_step)
    except ValueError as exc:
        fail(str(exc), "durations look like 30d, 12h, 90m or 45s")
    _check_names(namespace)
    policy = _policy(policy_file) if policy_file else None
    quota = _quota(quota_file, policy) if quota_file else None
    flavors = _flavors(policy, quota)
    api, kube_cls = _client(server, kubeconfig, in_cluster)
    try:
        review = build_pool_review(
            kube_cls(api),
            now_s=time.time(),
            period_s=period_s,
            planner=plan_for_diagnosis,
            namespace=namespace,
            policy=policy,
            quota=quota,
            flavors=flavors,
            prometheus=prometheus,
            node_label=node_label,
            step_s=step_s,
        )
    except KubeError as exc:
        fail(str(exc), "check --server/--kubeconfig and that the API server is reachable")
    except ReportError as exc:
        fail(str(exc), "check --prometheus (e.g. http://prometheus:9090)")
    if html_file is not None:
        stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        try:
            html_file.write_text(render_html(review, generated=stamp))
        except OSError as exc:
            fail(f"cannot write {html_file}: {exc.strerror}", "pick a writable path for --html")
    if as_json:
        emit_json(review.to_json())
        return
    print_table(TABLE_HEADERS, table_rows(review))
    for section in review.sections:
        for table in section.tables():
            sys.stdout.write(f"\n{table.title}\n")
            if table.rows:
                print_table(table.headers, table.rows)
            else:
                sys.stdout.write("(none)\n")
            for note in table.notes:
                sys.stdout.write(f"{note}\n")


@app.command("reset-breaker")
def reset_breaker_command(
    kubeconfig: KubeconfigOption = None,
    server: ServerOption = None,
    in_cluster: InClusterOption = False,
    namespace: NamespaceOption = "nodeagent",
    lease_name: LeaseOption = "nodeagent-tiering",
) -> None:
    """Close the circuit breaker; the leader resumes drains at its next renewal."""
    from nodeagent_tiering.cluster.cluster_api import KubeError
    from nodeagent_tiering.drain.leader import reset_breaker_on_lease

    _check_names(namespace, lease_name)
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


quota_app = typer.Typer(
    name="quota",
    help="Team quotas on Kueue: render the policy, check it against the cluster, keep flavors.",
    no_args_is_help=True,
)
app.add_typer(quota_app)

QuotaFileOption = Annotated[
    Path,
    typer.Option(
        "--file",
        "-f",
        envvar="NODEAGENT_TIERING_QUOTA",
        help="Quota policy file (version: v1).",
    ),
]
TierPolicyOption = Annotated[
    Path | None,
    typer.Option(
        "--policy",
        envvar="NODEAGENT_TIERING_POLICY",
        help="Tier policy: the quota may name only its tiers.",
        show_default=False,
    ),
]
KueueVersionOption = Annotated[
    str | None,
    typer.Option(
        "--kueue-version",
        help="Kueue API version to write: v1beta2, v1beta1, or auto (ask the cluster). "
        "Default: what the cluster serves with --apply/--sync, else v1beta2.",
        show_default=False,
    ),
]


def _kueue_api(version: str | None, kube: Any | None) -> Any:
    """The Kueue API to speak: as asked, or discovered from the cluster."""
    from nodeagent_tiering.cluster import kueue
    from nodeagent_tiering.cluster.cluster_api import KubeError

    if version not in (None, "auto") and version not in kueue.VERSIONS:
        fail(f"--kueue-version {version!r} is not one of auto, {', '.join(kueue.VERSIONS)}", "")
    if version not in (None, "auto"):
        return kueue.KueueApi(str(version))
    if kube is None:
        return kueue.KueueApi(kueue.VERSIONS[0])
    try:
        api = kube.kueue_api()
    except KubeError as exc:
        fail(str(exc), "check --server/--kubeconfig and that the API server is reachable")
    if api is None:
        fail(
            f"the cluster serves no Kueue API ({kueue.GROUP} {' or '.join(kueue.VERSIONS)})",
            "install Kueue (v0.15 or later serves v1beta2), or render without --apply",
        )
    return api


@quota_app.command("render")
def quota_render_command(
    quota_file: QuotaFileOption,
    policy_file: TierPolicyOption = None,
    kueue_version: KueueVersionOption = None,
    flavors: Annotated[
        bool,
        typer.Option(
            "--flavors/--no-flavors",
            help="Include the tiers' ResourceFlavors (the tiering service keeps them too).",
        ),
    ] = True,
    apply: Annotated[
        bool,
        typer.Option(
            "--apply",
            help="Server-side apply as field manager nodeagent; never overwrite what nodeagent "
            "does not own.",
        ),
    ] = False,
    prune: Annotated[
        bool,
        typer.Option("--prune", help="With --apply: delete nodeagent's queues the policy dropped."),
    ] = False,
    kubeconfig: KubeconfigOption = None,
    server: ServerOption = None,
    in_cluster: InClusterOption = False,
) -> None:
    """Print the ClusterQueues, Cohorts, LocalQueues (and flavors), and the request templates'
    ValidatingAdmissionPolicies, as multi-document YAML, or apply them."""
    from nodeagent_tiering.cluster.cluster_api import KubeError
    from nodeagent_tiering.quota.apply import apply_objects, policy_objects
    from nodeagent_tiering.quota.policy import render_yaml

    if prune and not apply:
        fail("--prune deletes queues only when applying", "add --apply, or drop --prune")
    policy = _policy(policy_file) if policy_file else None
    quota = _quota(quota_file, policy)
    kube = None
    if apply or kueue_version == "auto":
        api_client, kube_cls = _client(server, kubeconfig, in_cluster)
        kube = kube_cls(api_client)
    api = _kueue_api(kueue_version, kube)
    objects = policy_objects(quota, api, include_flavors=flavors)
    if not apply:
        sys.stdout.write(render_yaml(objects))
        raise typer.Exit(EXIT_OK)
    assert kube is not None  # --apply made the client above
    try:
        report = apply_objects(kube, api, objects, prune=prune)
    except KubeError as exc:
        fail(str(exc), "check --server/--kubeconfig and the RBAC of this identity")
    for line in report.lines():
        sys.stdout.write(f"{line}\n")
    raise typer.Exit(EXIT_OK if report.ok else EXIT_DRIFT)


@quota_app.command("check")
def quota_check_command(
    quota_file: QuotaFileOption,
    policy_file: TierPolicyOption = None,
    as_json: JsonOption = False,
    kubeconfig: KubeconfigOption = None,
    server: ServerOption = None,
    in_cluster: InClusterOption = False,
) -> None:
    """Check the quota against the cluster: guarantees the healthy nodes cannot back,
    over-commitment, missing queues and flavors. Exit 1 when a problem is found."""
    from nodeagent_tiering.cluster import kueue
    from nodeagent_tiering.cluster.cluster_api import KubeError
    from nodeagent_tiering.quota.backing import Cluster, check

    policy = _policy(policy_file) if policy_file else None
    quota = _quota(quota_file, policy)
    api_client, kube_cls = _client(server, kubeconfig, in_cluster)
    kube = kube_cls(api_client)
    api = _kueue_api(None, kube)
    desired = _flavors(policy, quota)
    try:
        cluster = Cluster(
            nodes=kube.list_nodes().get("items") or [],
            flavors=kube.list_kueue(api, kueue.RESOURCE_FLAVOR),
            cluster_queues=kube.list_kueue(api, kueue.CLUSTER_QUEUE),
            local_queues=kube.list_kueue(api, kueue.LOCAL_QUEUE),
            workloads=kube.list_kueue(api, kueue.WORKLOAD),
            api=api,
        )
    except KubeError as exc:
        fail(str(exc), "check --server/--kubeconfig and the RBAC of this identity")
    problems = check(quota, desired, cluster)
    if as_json:
        emit_json({"problems": [p.to_json() for p in problems]})
    else:
        for p in problems:
            sys.stdout.write(f"{p.line()}\n")
        if not problems:
            sys.stdout.write("quota policy backed by the cluster: no problems\n")
    raise typer.Exit(EXIT_DRIFT if problems else EXIT_OK)


@quota_app.command("flavors")
def quota_flavors_command(
    policy_file: PolicyOption,
    quota_file: QuotaOption = None,
    sync: Annotated[
        bool,
        typer.Option("--sync", help="Create, update and delete them once, as the service does."),
    ] = False,
    kueue_version: KueueVersionOption = None,
    kubeconfig: KubeconfigOption = None,
    server: ServerOption = None,
    in_cluster: InClusterOption = False,
) -> None:
    """The tiers' ResourceFlavors: printed (a dry run), or synced once with --sync."""
    from nodeagent_tiering.cluster.cluster_api import KubeError
    from nodeagent_tiering.quota.flavors import FlavorSync
    from nodeagent_tiering.quota.policy import render_yaml

    policy = _policy(policy_file)
    quota = _quota(quota_file, policy) if quota_file else None
    desired = _flavors(policy, quota)
    kube = None
    if sync or kueue_version == "auto":
        api_client, kube_cls = _client(server, kubeconfig, in_cluster)
        kube = kube_cls(api_client)
    api = _kueue_api(kueue_version, kube)
    if not sync:
        sys.stdout.write(render_yaml(f.to_object(api) for f in desired))
        raise typer.Exit(EXIT_OK)
    assert kube is not None  # --sync made the client above
    try:
        report = FlavorSync(kube, api).sync(desired)
    except KubeError as exc:
        fail(str(exc), "check --server/--kubeconfig and the RBAC of this identity")
    lines = [f"ResourceFlavor {n}: created" for n in report.created]
    lines += [f"ResourceFlavor {n}: updated" for n in report.updated]
    lines += [f"ResourceFlavor {n}: unchanged" for n in report.unchanged]
    lines += [f"ResourceFlavor {n}: deleted (no tier wants it)" for n in report.deleted]
    lines += [
        f"ResourceFlavor {n}: no tier wants it; kept, ClusterQueues name it ({', '.join(u)})"
        for n, u in report.kept.items()
    ]
    lines += [
        f"ResourceFlavor {n}: exists and is not managed by nodeagent; left alone"
        for n in report.foreign
    ]
    lines += [f"ResourceFlavor {n}: drifted: {note}" for n, note in report.drifted.items()]
    lines += report.errors
    for line in lines:
        sys.stdout.write(f"{line}\n")
    bad = report.foreign or report.drifted or report.errors
    raise typer.Exit(EXIT_DRIFT if bad else EXIT_OK)


NOTHING_WAITS = "no pending GPU pods, and no GPU job waiting in Kueue\n"
PENDING_HEADERS = ["POD", "REQUEST", "REASON", "EVIDENCE", "SMALLEST UNBLOCKING CHANGE"]


def _pending_rows(result: Any) -> list[list[str]]:
    return [
        [
            # A job waiting in Kueue has no pod yet: its row names the job as kind/name.
            d.pod if d.kind == "Pod" else f"{d.kind}/{d.pod}",
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
        str | None,
        typer.Argument(
            help="One pod, or a job waiting in Kueue (in --namespace, default `default`)."
        ),
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
    """Why each pending GPU pod (and each GPU job waiting in Kueue) waits, and the smallest
    change that would unblock it."""
    from nodeagent_tiering.cluster.cluster_api import KubeError
    from nodeagent_tiering.cluster.view import read_view
    from nodeagent_tiering.pending.diagnosis import diagnose_some
    from nodeagent_tiering.pending.results import settings_for

    policy = _policy(policy_file) if policy_file else None
    api, kube_cls = _client(server, kubeconfig, in_cluster)
    kube = kube_cls(api)
    try:
        view = read_view(kube)
    except KubeError as exc:
        fail(str(exc), "check --server/--kubeconfig and that the API server is reachable")
    if pod is not None and namespace is None:
        namespace = "default"
    result = diagnose_some(
        view, plan_for_diagnosis, settings_for(policy), namespace=namespace, pod=pod
    )
    if pod is not None and not result.diagnoses:
        found = next((p for p in view.pods if (p.namespace, p.name) == (namespace, pod)), None)
        if found is None:
            fail(
                f"no pod and no job waiting in Kueue called {namespace}/{pod}",
                "check the name and -n NAMESPACE",
            )
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
        sys.stdout.write(NOTHING_WAITS)


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
    from nodeagent_tiering.cluster.clusterfile import ClusterFileError, load_cluster
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
            local_queues=simulated.kueue_objects("LocalQueue"),
            cluster_queues=simulated.kueue_objects("ClusterQueue"),
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
        sys.stdout.write(NOTHING_WAITS)
