"""``nodeagent tiering quota check`` against the real control plane: capacity shortfalls,
the capacity health takes away, over-commitment, MIG capacity from what the device plugin
advertises, queues that do not exist, and other people's queues on nodeagent's flavors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from nodeagent import labels as lbl
from nodeagent.cli.tiering import app
from nodeagent_tiering.cluster import kueue
from nodeagent_tiering.cluster.nodes import DrainRecord, Node, Phase
from nodeagent_tiering.quota.apply import apply_objects
from nodeagent_tiering.quota.policy import render
from nodeagent_tiering.quota.reserve import ReservedNodes, ReserveSpec
from tests.tiering.quota.conftest import KueueEnv, quota_policy, wait_for


def policy(env: KueueEnv, quotas: dict[str, int], mig: dict[str, int] | None = None):
    tier = env.name("train")
    teams = []
    for team, amount in quotas.items():
        resources: dict[str, Any] = {"nvidia.com/gpu": {"guaranteed": amount}}
        if mig and team in mig:
            resources["nvidia.com/mig-1g.10gb"] = {"guaranteed": mig[team]}
        teams.append(
            {
                "name": env.name(team),
                "namespaces": [env.name(team)],
                "tiers": {tier: {"resources": resources}},
            }
        )
    return {"version": "v1", "teams": teams}, tier


def check(env: KueueEnv, data: dict[str, Any], tmp_path: Path, *extra: str):
    path = tmp_path / "quota.yaml"
    path.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(
        app, ["quota", "check", "-f", str(path), "--kubeconfig", str(env.plane.admin.path), *extra]
    )
    return result.exit_code, result.stdout.splitlines()


def apply(env: KueueEnv, data: dict[str, Any]) -> None:
    for team in data["teams"]:
        for ns in team["namespaces"]:
            if ns not in env._namespaces:
                env.plane.create_namespace(ns)
                env._namespaces.append(ns)
    report = apply_objects(env.kube, env.api, render(quota_policy(data), env.api))
    assert report.ok, report.lines()


def unstable(env: KueueEnv, node: str) -> None:
    env.core.patch_node_status(
        node,
        {
            "status": {
                "conditions": [
                    {
                        "type": lbl.GPU_HEALTHY_CONDITION,
                        "status": "False",
                        "reason": "Xid79",
                        "message": "GPU 3 fell off the bus",
                    }
                ]
            }
        },
    )


def test_a_backed_policy_has_no_problems_until_health_takes_capacity_away(env, tmp_path):
    data, tier = policy(env, {"a": 8, "b": 8})
    env.node("n1", tier)
    env.node("n2", tier)
    apply(env, data)
    code, lines = check(env, data, tmp_path)
    assert (code, lines) == (0, ["quota policy backed by the cluster: no problems"])

    unstable(env, env.name("n2"))
    code, lines = check(env, data, tmp_path)
    assert code == 1
    shortfall = (
        f"the tier promises 16 and its healthy nodes hold 8 of 16 ({env.name('n2')} unstable "
        "(GPUHealthy=False (Xid79): GPU 3 fell off the bus; no faulty GPU published)): "
        "8 not backed"
    )
    assert lines == [
        f"team {env.name('a')}, tier {tier}, nvidia.com/gpu: guaranteed 8 cannot be backed: "
        + shortfall,
        f"team {env.name('b')}, tier {tier}, nvidia.com/gpu: guaranteed 8 cannot be backed: "
        + shortfall,
    ]


def test_drained_and_cordoned_nodes_back_nothing(env, tmp_path):
    data, tier = policy(env, {"a": 16})
    record = DrainRecord(Phase.DRAINED, tier, "GPUHealthy=False (Xid48)", 1.0, 2.0)
    env.node("n1", tier)
    env.node(
        "n2",
        "quarantine",
        unschedulable=True,
        annotations={lbl.DRAIN_ANNOTATION: record.to_json()},
    )
    env.node("n3", tier, unschedulable=True)
    apply(env, data)
    code, lines = check(env, data, tmp_path)
    assert code == 1
    (line,) = lines
    assert line.startswith(f"team {env.name('a')}, tier {tier}, nvidia.com/gpu: guaranteed 16 ")
    assert (
        f"healthy nodes hold 8 of 24 ({env.name('n2')} drained (GPUHealthy=False (Xid48)); "
        f"{env.name('n3')} cordoned): 8 not backed"
    ) in line


def test_over_commitment_and_mig_capacity_from_allocatable(env, tmp_path):
    data, tier = policy(env, {"a": 8, "b": 4}, mig={"b": 14})
    env.node("n1", tier)
    env.node("mig", tier, gpus=0, capacity={"nvidia.com/mig-1g.10gb": "7"})
    apply(env, data)
    code, lines = check(env, data, tmp_path, "--json")
    assert code == 1
    problems = yaml.safe_load("\n".join(lines))["problems"]
    by = {(p["team"], p["resource"]): p for p in problems}
    gpu_a = by[(env.name("a"), "nvidia.com/gpu")]
    assert gpu_a["kind"] == "overcommitted"
    assert "the tier promises 12 and its nodes have 8 installed" in gpu_a["message"]
    assert by[(env.name("b"), "nvidia.com/gpu")]["kind"] == "overcommitted"
    mig = by[(env.name("b"), "nvidia.com/mig-1g.10gb")]
    assert mig["kind"] == "overcommitted"
    assert "promises 14 and its nodes have 7 installed" in mig["message"]
    assert mig["tier"] == tier


def test_teams_without_a_queue_and_missing_flavors(env, tmp_path):
    data, tier = policy(env, {"a": 1, "b": 1})
    env.node("n1", tier)
    apply(env, {**data, "teams": data["teams"][:1]})  # team b's queues were never applied
    env.plane.create_namespace(env.name("b"))
    env._namespaces.append(env.name("b"))
    env.pod(env.name("b"), "w1", gpus=1, queue="gpu-queue")
    wait_for(lambda: env.workloads(env.name("b")), what="Kueue to make the pod's Workload")
    code, lines = check(env, data, tmp_path)
    assert code == 1
    b = env.name("b")
    assert (
        f"team {b}, tier {tier}: ClusterQueue {b}-{tier} does not exist "
        "(`nodeagent tiering quota render --apply` creates it)"
    ) in lines
    assert (
        f"team {b}, tier {tier}: LocalQueue {b}/{tier} does not exist: jobs in {b} cannot "
        f"reach tier {tier}"
    ) in lines
    assert (
        f"team {b}: 1 workloads in {b} wait on LocalQueue gpu-queue, which does not exist"
    ) in lines
    assert not [line for line in lines if line.startswith(f"team {env.name('a')}")]


def test_someone_elses_queue_on_a_nodeagent_flavor_counts_toward_the_promise(env, tmp_path):
    data, tier = policy(env, {"a": 6})
    env.node("n1", tier)
    apply(env, data)
    env.plane.apply([env.foreign_cluster_queue("legacy", tier, 4)])
    code, lines = check(env, data, tmp_path)
    assert code == 1
    assert lines == [
        f"team {env.name('a')}, tier {tier}, nvidia.com/gpu: guaranteed 6 cannot be backed: the "
        "tier promises 10 and its nodes have 8 installed",
        f"tier {tier}, nvidia.com/gpu: ClusterQueue {env.name('legacy')} (not nodeagent's): "
        "guaranteed 4 cannot be backed: the tier promises 10 and its nodes have 8 installed",
    ]


def test_a_tainted_tier_whose_node_lacks_the_taint(env, tmp_path):
    data, tier = policy(env, {"a": 8})
    taint = {"key": "nodeagent.io/dedicated", "value": "train", "effect": "NoSchedule"}
    data["tiers"] = {tier: {"taints": [taint]}}
    env.node("n1", tier)
    apply(env, data)
    code, lines = check(env, data, tmp_path)
    assert code == 1
    assert lines == [
        f"tier {tier}: node {env.name('n1')} lacks the taint nodeagent.io/dedicated=train:"
        f"NoSchedule that flavor {tier} declares"
    ]


def test_quota_changed_on_the_cluster_is_drift_and_what_kueue_admits_against(env, tmp_path):
    # Issue 27 item 3: the file says 8 + 8 on 16 GPUs, someone raised team a's queue to 20.
    data, tier = policy(env, {"a": 8, "b": 8})
    env.node("n1", tier)
    env.node("n2", tier)
    apply(env, data)
    cq = f"{env.name('a')}-{tier}"
    env.edit("clusterqueues", cq, ["spec", "resourceGroups", 0, "flavors", 0, "resources", 0,
                                   "nominalQuota"], 20)  # fmt: skip
    code, lines = check(env, data, tmp_path)
    assert code == 1
    fix = "(`nodeagent tiering quota render --apply` restores the policy's; or change the policy)"
    assert (
        f"team {env.name('a')}, tier {tier}, nvidia.com/gpu: ClusterQueue {cq}, flavor {tier}: "
        f"guarantees 20 on the cluster, 8 in the policy {fix}"
    ) in lines
    # Backing counts what Kueue admits against, as the service's metrics do: 28 on 16.
    over = [line for line in lines if "cannot be backed" in line]
    assert len(over) == 2, lines
    assert all("the tier promises 28 and its nodes have 16 installed" in x for x in over), over

    # The other way: the policy adds a MIG quota the cluster's queue does not have yet.
    data_mig, _ = policy(env, {"a": 20, "b": 8}, mig={"a": 2})
    code, lines = check(env, data_mig, tmp_path)
    drift = [line for line in lines if f"ClusterQueue {cq}" in line]
    assert any(
        "nvidia.com/mig-1g.10gb" in x
        and "the policy guarantees 2, the cluster's queue has no quota for it" in x
        for x in drift
    ), drift
    assert not any("guarantees 20 on the cluster" in x for x in drift), drift

    # And back in line: no drift.
    env.edit("clusterqueues", cq, ["spec", "resourceGroups", 0, "flavors", 0, "resources", 0,
                                   "nominalQuota"], 8)  # fmt: skip
    code, lines = check(env, data, tmp_path)
    assert (code, lines) == (0, ["quota policy backed by the cluster: no problems"])


def test_the_reserves_queues_are_checked_like_the_teams(env, tmp_path):
    # The reserve's ClusterQueue is nodeagent's too: a quota changed by hand is drift, and a
    # missing LocalQueue leaves the reserve's team no way in.
    data, tier = policy(env, {"a": 8})
    research = env.name("a")
    data["tiers"] = {tier: {"reserve": {"nodes": 1, "gpus": 8, "teams": [research]}}}
    env.node("n1", tier)
    env.node("n2", tier)
    apply(env, data)
    # The service keeps one node for the reserve (what backs the reserve's queue).
    marker = ReservedNodes(env.kube, [ReserveSpec(tier, 1, 8)])
    marker.sync([Node.from_object(n) for n in env.kube.list_nodes()["items"]])
    code, lines = check(env, data, tmp_path)
    assert (code, lines) == (0, ["quota policy backed by the cluster: no problems"])

    cq = f"{tier}-reserved"
    env.edit("clusterqueues", cq, ["spec", "resourceGroups", 0, "flavors", 0, "resources", 0,
                                   "nominalQuota"], 16)  # fmt: skip
    env.custom.delete_namespaced_custom_object(
        kueue.GROUP, env.api.version, research, "localqueues", f"{tier}-large"
    )
    code, lines = check(env, data, tmp_path)
    assert code == 1
    assert (
        f"tier {tier}, nvidia.com/gpu: ClusterQueue {cq}, flavor {tier}-reserved: guarantees 16 "
        "on the cluster, 8 in the policy (`nodeagent tiering quota render --apply` restores the "
        "policy's; or change the policy)"
    ) in lines, lines
    assert (
        f"tier {tier}: LocalQueue {research}/{tier}-large does not exist: jobs in {research} "
        f"cannot reach the reserve of tier {tier}"
    ) in lines, lines
