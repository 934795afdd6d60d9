"""Reclaim time of capacity reserved for large jobs and lent while idle, on the real Kueue.

A control plane of the project's pinned kube-apiserver, kube-scheduler, controller-manager and
Kueue (``make kube-bins``) with the kubelet stand-in, two kubelet-less 8-GPU nodes in one tier,
and the quota policy's ``reserve`` of one node rendered and applied by nodeagent; the tiering
service's marker keeps the first node reserved.

Each round, interleaved:

- baseline: the reserved node is idle; an 8-GPU job arrives in the reserve's LocalQueue;
  measured from its creation until kube-scheduler binds it to the reserved node;
- reclaim: another team's job borrowed the reserved node (it is running there); the same
  8-GPU job arrives; Kueue preempts the borrower and admits the large job; measured the same
  way, from creation until bound to the reserved node.

The large job and the borrower are deleted between rounds (and their Workloads gone) so every
round starts the same. Prints medians and p99 (nearest rank), and the ratio of the two.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import psutil
import yaml
from kubernetes import client, watch
from tiering_common import count_options, nearest_rank

from nodeagent import labels as lbl
from nodeagent.testing.kube.controlplane import ControlPlane
from nodeagent.testing.kube.nodes import KubeletStandIn, create_node, pod_manifest
from nodeagent_tiering.cluster import kueue
from nodeagent_tiering.cluster.cluster_api import Kube
from nodeagent_tiering.cluster.nodes import Node
from nodeagent_tiering.quota.apply import apply_objects
from nodeagent_tiering.quota.policy import parse_quota_policy, render, reserved_local_queue
from nodeagent_tiering.quota.reserve import ReservedNodes, ReserveSpec

TIER = "train"


def wait(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise SystemExit(f"timed out after {timeout_s:.0f} s waiting for {what}")


def bound(core: client.CoreV1Api, namespace: str, name: str) -> str:
    """Wait (a watch, so the moment is not a poll's) until pod ``name`` is bound; its node."""
    stream = watch.Watch()
    try:
        for event in stream.stream(
            core.list_namespaced_pod,
            namespace,
            field_selector=f"metadata.name={name}",
            timeout_seconds=120,
        ):
            node = event["object"].spec.node_name
            if node:
                return str(node)
    finally:
        stream.stop()
    raise SystemExit(f"pod {namespace}/{name} was never bound")


def gone(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    return not core.list_namespaced_pod(namespace, field_selector=f"metadata.name={name}").items


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    count_options(parser, rounds=20)
    args = parser.parse_args()
    memory = psutil.virtual_memory().total / 2**30
    print(f"machine: {platform.machine()}, {psutil.cpu_count()} CPUs, {memory:.0f} GiB, "
          f"Python {platform.python_version()}")  # fmt: skip
    started = time.perf_counter()
    with ControlPlane(scheduler=True, controller_manager=True, kueue=True) as plane:
        print(f"reserved capacity on the real Kueue: control plane up in {plane.started_s:.1f} s")
        api_client = plane.api_client()
        core = client.CoreV1Api(api_client)
        kube = Kube(api_client)
        kubelets = KubeletStandIn(api_client).start()
        kubelets.synced.wait(30)
        try:
            for ns in ("small", "large"):
                plane.create_namespace(ns)
            policy = parse_quota_policy(
                yaml.safe_dump(
                    {
                        "version": "v1",
                        "tiers": {TIER: {"reserve": {"nodes": 1, "teams": ["research"]}}},
                        "teams": [
                            {
                                "name": "vision",
                                "namespaces": ["small"],
                                "tiers": {
                                    TIER: {"resources": {"nvidia.com/gpu": {"guaranteed": 8}}}
                                },
                            },
                            {
                                "name": "research",
                                "namespaces": ["large"],
                                "tiers": {
                                    TIER: {"resources": {"nvidia.com/gpu": {"guaranteed": 0}}}
                                },
                            },
                        ],
                    }
                )
            )
            api = kube.kueue_api()
            assert api is not None
            report = apply_objects(kube, api, render(policy, api))
            assert report.ok, report.lines()
            for name in ("node-a", "node-b"):
                create_node(api_client, name, {lbl.TIER: TIER, lbl.STABILITY: "stable"}, gpus=8)
            nodes = [Node.from_object(n) for n in kube.list_nodes()["items"]]
            (choice,) = ReservedNodes(kube, [ReserveSpec(TIER, 1, 8)]).sync(nodes).values()
            reserved = choice.kept[0]
            queue = reserved_local_queue(policy, TIER)

            def pod(namespace: str, name: str, queue_name: str) -> None:
                labels = {lbl.KUEUE_QUEUE_NAME: queue_name}
                core.create_namespaced_pod(namespace, pod_manifest(name, gpus=8, labels=labels))

            # The small team's guarantee keeps node-b busy for the whole run.
            pod("small", "own", TIER)
            wait(lambda: core.read_namespaced_pod("own", "small").spec.node_name, 60, "own")
            baseline: list[float] = []
            reclaim: list[float] = []
            for i in range(args.rounds):
                for kind in ("baseline", "reclaim"):
                    if kind == "reclaim":
                        borrower = f"borrow-{i}"
                        pod("small", borrower, TIER)
                        node = wait(
                            lambda b=borrower: core.read_namespaced_pod(b, "small").spec.node_name,
                            60,
                            "the borrower to run on the reserved node",
                        )
                        assert node == reserved, node
                    name = f"{kind}-{i}"
                    start = time.perf_counter()
                    pod("large", name, queue)
                    node = bound(core, "large", name)
                    took = time.perf_counter() - start
                    assert node == reserved, node
                    (reclaim if kind == "reclaim" else baseline).append(took)
                    core.delete_namespaced_pod(name, "large", grace_period_seconds=0)
                    wait(lambda n=name: gone(core, "large", n), 60, f"{name} to be deleted")
                    if kind == "reclaim":
                        wait(lambda b=borrower: gone(core, "small", b), 60, "the borrower gone")
                    # Kueue frees the quota once the Workload is gone with its pod.
                    wait(
                        lambda: all(
                            (w.get("metadata") or {}).get("namespace") != "large"
                            for w in kube.list_kueue(api, kueue.WORKLOAD)
                        ),
                        60,
                        "the large job's Workload to go",
                    )
        finally:
            kubelets.stop()
    rows = [
        ("large job, reserved node idle (baseline)", baseline),
        ("large job, reserved node lent (reclaim)", reclaim),
    ]
    print(f"  rounds: {args.rounds} of each, interleaved")
    for label, samples in rows:
        med, p99 = statistics.median(samples), nearest_rank(samples, 0.99)
        print(f"  {label:<44} median {med:6.2f} s  p99 {p99:6.2f} s")
    ratio = statistics.median(reclaim) / statistics.median(baseline)
    print(f"  reclaim / baseline, medians                  {ratio:6.2f}x")
    print(f"  load average at the end                      {psutil.getloadavg()[0]:6.2f}")
    print(f"  (bench wall time {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
