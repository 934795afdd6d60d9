"""Tiering service at scale on a real control plane: 5,000 nodes and 50,000 pods in kube-apiserver.

A subprocess (this script with ``--serve``) starts etcd and kube-apiserver from ``make kube-bins``
(no scheduler, controller manager or Kueue: the pods are created bound to their nodes, and
nothing else is needed), applies the tiering service's RBAC from the deploy manifests, creates
the nodes and pods through the API from a thread pool, and runs the kubelet stand-in with
``run_pods=False`` (it only finishes the deletions that evictions start). This process runs the
service under its ServiceAccount, so the RSS below is the service's alone; its API requests are
counted in kube-apiserver's audit log. Measured:

- control-plane start-up, and how long creating the objects took;
- the initial list into the watch-driven node cache, and the first pass (labels every node);
- steady-state full reconcile passes (plan over all nodes, nothing to write): median and p99
  of ``--passes`` passes -- target < 1 s -- and the API requests per pass;
- the service's RSS after all of that -- target < 300 MB;
- time from a node's stability label turning ``unstable`` (a PATCH from another client) to
  the node being cordoned, with the real event-driven loop running, seen through a watch on the
  node: median and p99 of ``--cordons`` samples -- target < 2 s. After each sample the label
  goes back and the bench waits for the service to return the node (``recovery_period_s`` is
  0 here), so every sample starts from one quiet cluster with no drain running; the requests of
  one whole cycle (cordon, ten evictions, events, return) are counted too;
- baseline, same run: listing the nodes through the client's generated models, which is what
  the raw-JSON cache avoids (median of 3, as is the cache list).

Run: ``.venv/bin/python bench/tiering_reconcile.py [--nodes 5000] [--pods 50000]
[--passes 200] [--cordons 200] [--threads 16]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psutil
from tiering_common import count_options, nearest_rank

from nodeagent import labels as lbl
from nodeagent.testing.kube import waiting
from nodeagent.testing.kube.audit import audit_mark, read_audit
from nodeagent_tiering.cluster.clock import SystemClock
from nodeagent_tiering.cluster.cluster_api import Kube, api_client
from nodeagent_tiering.cluster.informer import NodeCache
from nodeagent_tiering.cluster.tier_policy import parse_policy
from nodeagent_tiering.drain.controller import Controller

T = TypeVar("T")
NAMESPACE = "bench"
PRODUCTS = ["NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB", "NVIDIA-L40S"]

POLICY = {
    "version": "v1",
    "tiers": [
        {
            "name": "training",
            "selector": {
                "match_labels": {lbl.NVLINK_LARGEST_SET: "8"},
                "match_expressions": [
                    {"key": lbl.GPU_PRODUCT, "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}
                ],
            },
            "stability": ["stable"],
            "min_healthy": "50%",
            "max_draining": "10%",
        },
        {"name": "general", "selector": {"match_labels": {lbl.GPU_COUNT: "8"}}},
        {"name": "shared"},
    ],
    "budget": {"max_draining": 50, "cooldown_s": 0},
    # Nodes return as soon as they are stable again, so each latency sample starts clean.
    "recovery_period_s": 0,
    "breaker": {"percentage": 50, "window_s": 300},
}


def node_name(i: int) -> str:
    return f"node-{i:05d}"


# --- the control plane's side (``--serve``, a separate process) --------------------------------


def serve(nodes: int, pods: int, threads: int) -> None:
    """Start, populate, print what the measuring process needs, serve until stdin closes."""
    from nodeagent.testing.kube.bulk import BulkWriter, node_writes, pod_write
    from nodeagent.testing.kube.controlplane import ControlPlane
    from nodeagent.testing.kube.deploy import install_identities
    from nodeagent.testing.kube.nodes import KubeletStandIn, pod_manifest

    plane = ControlPlane()
    plane.start()
    try:
        identities = install_identities(plane)
        plane.create_namespace(NAMESPACE)
        writer = BulkWriter(plane, threads)

        def node_batches() -> Iterator[list[Any]]:
            for i in range(nodes):
                product = PRODUCTS[i % len(PRODUCTS)]
                labels = {
                    lbl.GPU_PRODUCT: product,
                    lbl.GPU_COUNT: "8",
                    lbl.NVLINK_LARGEST_SET: "8" if "L40S" not in product else "1",
                    lbl.STABILITY: "stable",
                    lbl.GPU_HEALTH: "healthy",
                    lbl.POOL: "default",
                }
                yield node_writes(node_name(i), labels)

        def pod_batches() -> Iterator[list[Any]]:
            for j in range(pods):
                pod = pod_manifest(f"pod-{j:06d}", node_name=node_name(j % max(nodes, 1)))
                yield pod_write(NAMESPACE, pod)

        t0 = time.perf_counter()
        sent = writer.run(node_batches())
        nodes_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        sent += writer.run(pod_batches())
        pods_s = time.perf_counter() - t0
        kubelets = KubeletStandIn(plane.api_client(), run_pods=False).start()
        kubelets.synced.wait(300)
        report = {
            "start_s": plane.started_s,
            "nodes_s": nodes_s,
            "pods_s": pods_s,
            "requests": sent,
            "tiering_kubeconfig": str(identities.tiering.kubeconfig.path),
            "tiering_user": identities.tiering.user,
            "admin_kubeconfig": str(plane.admin.path),
            "audit_log": str(plane.audit_log),
        }
        print(json.dumps(report), flush=True)
        sys.stdin.read()  # until the measuring process closes the pipe (or dies)
        kubelets.stop()
    finally:
        plane.stop()


# --- the service's side (this process) ---------------------------------------------------------


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    """Seconds ``fn`` took, and what it returned."""
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def spread(what: str, samples: list[float], target: str) -> list[tuple[str, str, str]]:
    """Report rows of the median, the 99th percentile and the worst of ``samples`` (seconds)."""
    n = len(samples)
    return [
        (f"{what}, median of {n}", f"{statistics.median(samples):.3f} s", target),
        (f"{what}, p99 of {n}", f"{nearest_rank(samples, 0.99):.3f} s", target),
        (f"{what}, worst of {n}", f"{max(samples):.3f} s", target),
    ]


def cordoned(admin: Any, name: str, unschedulable: bool, start: float) -> float:
    """Seconds from ``start`` until a watch on node ``name`` shows it (un)cordoned."""
    waiting.node(
        admin,
        name,
        lambda node: bool(node["spec"].get("unschedulable")) is unschedulable,
        what=f"tiering service: node {name} {'cordoned' if unschedulable else 'returned'}",
        timeout_s=30,
    )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    count_options(parser, nodes=5000, pods=50000, passes=200, cordons=200)
    parser.add_argument("--threads", type=int, default=16, help="creating objects")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.nodes, args.pods, args.threads)
        return

    wall = time.perf_counter()
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", "--nodes", str(args.nodes), "--pods",
         str(args.pods), "--threads", str(args.threads)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert server.stdout is not None
    assert server.stdin is not None
    line = server.stdout.readline()
    if not line.startswith("{"):
        server.kill()
        raise SystemExit(f"the control plane did not start: {line!r}")
    setup = json.loads(line)
    audit = Path(setup["audit_log"])
    user = setup["tiering_user"]

    def requests_of(fn: Callable[[], T]) -> tuple[float, Counter[str], T]:
        """Seconds ``fn`` took, the service's API requests meanwhile, and what it returned."""
        mark = audit_mark(audit)
        seconds, result = timed(fn)
        time.sleep(0.05)  # each request's audit event is written as its response completes
        asked = Counter(f"{r.verb} {r.resource}" for r in read_audit(audit, mark, user))
        return seconds, asked, result

    try:
        kube = Kube(api_client(kubeconfig=Path(setup["tiering_kubeconfig"])))
        admin = api_client(kubeconfig=Path(setup["admin_kubeconfig"]))
        policy = parse_policy(POLICY)

        baseline_s = statistics.median(timed(lambda: kube.core.list_node())[0] for _ in range(3))
        cache = NodeCache(kube)
        list_s = statistics.median(timed(cache.relist)[0] for _ in range(3))
        ctl = Controller(kube, cache, policy, clock=SystemClock())
        first_s, first_requests, first = requests_of(ctl.reconcile_once)
        cache.relist()
        passes, passes_cpu = [], []
        steady_requests: Counter[str] = Counter()
        for _ in range(args.passes):
            # This thread's CPU time beside the wall time: a busy machine stretches the latter.
            cpu = time.thread_time()
            seconds, asked, steady = requests_of(ctl.reconcile_once)
            passes_cpu.append(time.thread_time() - cpu)
            passes.append(seconds)
            steady_requests += asked
            assert not steady.actions, "steady state must have nothing to do"
        rss_mb = psutil.Process().memory_info().rss / 2**20

        # Event-driven latency: the real loop runs; another client flips a node to unstable.
        stop = threading.Event()
        loop = threading.Thread(target=ctl.run, args=(stop,), daemon=True)
        loop.start()
        time.sleep(1.0)  # let the informer start watching
        other = Kube(admin)
        latencies, returns = [], []
        cycle: Counter[str] = Counter()
        for i in range(args.cordons):
            name = node_name((i * 97) % args.nodes)

            def one_cycle(name: str = name) -> None:
                start = time.perf_counter()
                other.patch_node(name, {"metadata": {"labels": {lbl.STABILITY: "unstable"}}})
                latencies.append(cordoned(admin, name, True, start))
                # Put the node back and wait until the service has returned it, so the next
                # sample starts with no drain running.
                start = time.perf_counter()
                other.patch_node(name, {"metadata": {"labels": {lbl.STABILITY: "stable"}}})
                returns.append(cordoned(admin, name, False, start))

            _, asked, _ = requests_of(one_cycle)
            cycle += asked
        stop.set()
        loop.join(timeout=10)
        rss_after_mb = psutil.Process().memory_info().rss / 2**20
    finally:
        server.stdin.close()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()

    n_pass, n_cordon = len(passes), len(latencies)
    objects = args.nodes * 2 + args.pods
    created_s = setup["nodes_s"] + setup["pods_s"]
    per_pass = sum(steady_requests.values()) / max(n_pass, 1)
    per_cycle = {k: v / max(n_cordon, 1) for k, v in sorted(cycle.items())}
    rows = [
        ("control plane start-up (etcd + kube-apiserver)", f"{setup['start_s']:.1f} s", ""),
        (
            f"create {args.nodes} nodes (object + status)",
            f"{setup['nodes_s']:.0f} s",
            f"{args.nodes * 2 / setup['nodes_s']:.0f} req/s",
        ),
        (
            f"create {args.pods} pods",
            f"{setup['pods_s']:.0f} s",
            f"{args.pods / setup['pods_s']:.0f} req/s",
        ),
        ("baseline: list nodes via client models (median of 3)", f"{baseline_s:.2f} s", ""),
        ("initial list into the raw-JSON cache (median of 3)", f"{list_s:.2f} s", ""),
        (f"first pass ({len(first.actions)} label writes)", f"{first_s:.2f} s", ""),
        (
            "  API requests of the first pass",
            str(sum(first_requests.values())),
            _fmt(first_requests),
        ),
        *spread("steady full reconcile pass", passes, "< 1 s"),
        (
            f"  CPU time of a steady pass, median / p99 of {n_pass}",
            f"{statistics.median(passes_cpu):.3f} s",
            f"p99 {nearest_rank(passes_cpu, 0.99):.3f} s",
        ),
        ("  API requests per steady pass", f"{per_pass:.1f}", ""),
        ("RSS after passes", f"{rss_mb:.0f} MB", "< 300 MB"),
        ("RSS after the cordon runs", f"{rss_after_mb:.0f} MB", "< 300 MB"),
        *spread("unstable -> cordon", latencies, "< 2 s"),
        (
            f"stable again -> returned, median of {len(returns)}",
            f"{statistics.median(returns):.3f} s",
            "",
        ),
        (
            "  API requests per cordon-drain-return cycle",
            f"{sum(per_cycle.values()):.1f}",
            ", ".join(f"{k} {v:g}" for k, v in per_cycle.items()),
        ),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"tiering at {args.nodes} nodes, {args.pods} pods (real kube-apiserver)")
    for name, value, note in rows:
        print(f"  {name.ljust(width)}  {value:>10}  {note}".rstrip())
    print(f"  ({objects} objects created in {created_s:.0f} s; bench wall time "
          f"{time.perf_counter() - wall:.0f} s)")  # fmt: skip


def _fmt(counts: Counter[str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))


if __name__ == "__main__":
    main()
