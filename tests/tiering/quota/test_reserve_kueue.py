"""Capacity reserved for large jobs and lent while idle, on the real control plane with Kueue.

nodeagent renders the quota (the reserved flavor, the ClusterQueue that owns it, borrowing for
the tier's teams) and marks the node it keeps; Kueue lends, preempts and admits, and
kube-scheduler places the pods. The test only reads what they decided.
"""

from __future__ import annotations

import time

from kubernetes import client

from nodeagent import labels as lbl
from nodeagent_tiering.cluster.nodes import Node
from nodeagent_tiering.quota.apply import apply_objects, policy_objects
from nodeagent_tiering.quota.policy import (
    flavors_of,
    render,
    reserved_local_queue,
    reserved_queue_name,
)
from nodeagent_tiering.quota.reserve import ReservedNodes, ReserveSpec
from nodeagent_tiering.review.inputs import read_inputs
from nodeagent_tiering.review.reserve import reserve_section
from tests.tiering.quota.conftest import KueueEnv, condition, quota_policy, wait_for

GPU = "nvidia.com/gpu"


def node_of(env: KueueEnv, namespace: str, pod: str) -> str | None:
    return env.core.read_namespaced_pod(pod, namespace).spec.node_name  # type: ignore[no-any-return]


def test_a_small_job_borrows_the_reserved_node_and_a_large_one_reclaims_it(env: KueueEnv) -> None:
    tier = env.name("train")
    small, large = env.namespace("small"), env.namespace("large")
    research = env.name("research")
    policy = quota_policy(
        {
            "version": "v1",
            "tiers": {tier: {"reserve": {"nodes": 1, "gpus": 8, "teams": [research]}}},
            "teams": [
                {
                    "name": env.name("vision"),
                    "namespaces": [small],
                    "tiers": {tier: {"resources": {GPU: {"guaranteed": 8}}}},
                },
                {
                    "name": research,
                    "namespaces": [large],
                    "tiers": {tier: {"resources": {GPU: {"guaranteed": 0}}}},
                },
            ],
        }
    )
    report = apply_objects(env.kube, env.api, render(policy, env.api))
    assert report.ok, report.lines()
    first, second = env.node("a", tier), env.node("b", tier)

    # The service keeps one whole node: both are empty, so the first by name.
    marker = ReservedNodes(env.kube, [ReserveSpec(tier, 1, 8)])
    listed = [Node.from_object(n) for n in env.kube.list_nodes()["items"]]
    (choice,) = marker.sync(listed).values()
    assert choice.kept == (first,)
    reserved = env.core.read_node(first)
    assert reserved.metadata.labels[lbl.RESERVED] == lbl.RESERVED_VALUE
    assert [(t.key, t.effect) for t in reserved.spec.taints] == [(lbl.RESERVED, "NoSchedule")]

    # The small team's guarantee fills the other node; its next job borrows the reserved one.
    env.pod(small, "s1", gpus=8, queue=tier)
    wait_for(lambda: node_of(env, small, "s1"), what="s1 to be placed")
    assert node_of(env, small, "s1") == second
    env.pod(small, "s2", gpus=8, queue=tier)
    wait_for(lambda: node_of(env, small, "s2"), what="s2 to borrow the reserved node")
    assert node_of(env, small, "s2") == first

    # A large job arrives in the reserve's queue: Kueue reclaims the lent quota by preempting
    # the borrower, and the large job lands on the reserved node, all 8 GPUs on one node.
    arrived = time.monotonic()
    env.pod(large, "big", gpus=8, queue=reserved_local_queue(policy, tier))
    wait_for(lambda: node_of(env, large, "big"), timeout_s=90, what="the large job to land")
    reclaim_s = time.monotonic() - arrived
    assert node_of(env, large, "big") == first
    preempted = [
        e.message
        for e in env.core.list_namespaced_event(small).items
        if e.reason == "Preempted" and e.involved_object.name.startswith("pod-s2-")
    ]
    assert preempted, "Kueue records why s2 was preempted"
    assert "reclamation within the cohort" in preempted[0]
    big = env.workloads(large)["big"]
    assert condition(big, "Admitted") == "True"
    assert big["status"]["admission"]["clusterQueue"] == reserved_queue_name(tier)
    assert "s2" not in env.workloads(small), "the borrower's Workload is gone with its pod"
    s1 = env.workloads(small)["s1"]
    assert condition(s1, "Admitted") == "True", "the team's own guarantee is not touched"
    print(f"reclaim: the large job placed {reclaim_s:.1f} s after it was created")

    # The review's account, from what Kueue holds: the large job admitted after a wait that
    # includes the reclaim and nothing large still waiting (its GPU-hours, seconds old here,
    # are counted in test_reserve_review.py).
    inputs = read_inputs(env.kube, now_s=time.time(), period_s=3600)
    section = reserve_section(inputs, policy, flavors_of(policy))
    assert section is not None
    account = section.to_json()[tier]
    assert account["large_jobs_admitted"] == 1
    assert account["wait_p99_s"] <= reclaim_s + 1
    assert account["waiting"] == []


def test_a_reserved_node_that_fails_is_replaced_and_unmarked(env: KueueEnv, caplog) -> None:
    tier = env.name("train")
    dedicated = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
    first = env.node("a", tier, taints=[dedicated])
    second = env.node("b", tier)
    marker = ReservedNodes(env.kube, [ReserveSpec(tier, 1, 8)])

    def sync() -> tuple[str, ...]:
        nodes = [Node.from_object(n) for n in env.kube.list_nodes()["items"]]
        (choice,) = marker.sync(nodes).values()
        return choice.kept

    assert sync() == (first,)
    # The agents report the node unstable: the next sync moves the reserve and says why.
    env.core.patch_node(first, {"metadata": {"labels": {lbl.STABILITY: "unstable"}}})
    caplog.set_level("INFO", logger="nodeagent_tiering.quota.reserve")
    assert sync() == (second,)
    failed = env.core.read_node(first)
    assert lbl.RESERVED not in failed.metadata.labels
    assert [(t.key, t.value) for t in failed.spec.taints] == [("dedicated", "ml")]
    kept = env.core.read_node(second)
    assert kept.metadata.labels[lbl.RESERVED] == lbl.RESERVED_VALUE
    lines = [r.getMessage() for r in caplog.records]
    assert f"node {first}: no longer kept for large jobs (unstable); another replaces it" in lines
    assert f"node {second}: kept for large jobs (label and taint {lbl.RESERVED})" in lines
    # Nothing changed: nothing written.
    before = env.core.read_node(second).metadata.resource_version
    assert sync() == (second,)
    assert env.core.read_node(second).metadata.resource_version == before


def test_the_reserves_queue_takes_whole_node_jobs_only(env: KueueEnv) -> None:
    # A smaller job in the reserve's queue would hold reserved quota that is the reserve's
    # own (not lent), so nothing would reclaim it: the API server refuses it.
    tier, large = env.name("train"), env.namespace("large")
    research = env.name("research")
    policy = quota_policy(
        {
            "version": "v1",
            "tiers": {tier: {"reserve": {"nodes": 1, "gpus": 8, "teams": [research]}}},
            "teams": [
                {
                    "name": research,
                    "namespaces": [large],
                    "tiers": {tier: {"resources": {GPU: {"guaranteed": 0}}}},
                }
            ],
        }
    )
    report = apply_objects(env.kube, env.api, policy_objects(policy, env.api))
    assert report.ok, report.lines()
    queue = reserved_local_queue(policy, tier)
    tries: list[str] = []

    def refused() -> str | None:
        name = f"half-{len(tries)}"
        try:
            env.pod(large, name, gpus=4, queue=queue)
        except client.ApiException as exc:
            return str(exc.body)
        tries.append(name)  # taken before the API server loaded the policy
        return None

    message = wait_for(refused, what="the API server to refuse a 4-GPU job in the reserve")
    assert (
        f"nvidia.com/gpu: 4 per pod is not a shape the reserve of tier {tier} allows (8); "
        "the nearest allowed is 8"
    ) in message
    env.pod(large, "whole", gpus=8, queue=queue)  # a whole node's job goes in
