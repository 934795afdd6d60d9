"""``quota render --apply`` on the real API server: what a platform team already runs keeps
working. Someone else's queue of the same name is left alone, a field someone else changed is
not taken over, and only nodeagent's own objects are pruned."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from nodeagent.cli.tiering import app
from nodeagent_tiering.cluster import kueue
from tests.tiering.quota.conftest import KueueEnv


def apply(env: KueueEnv, data: dict[str, Any], tmp_path: Path, *extra: str):
    path = tmp_path / "quota.yaml"
    path.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(
        app,
        [
            "quota",
            "render",
            "-f",
            str(path),
            "--kubeconfig",
            str(env.plane.admin.path),
            "--apply",
            *extra,
        ],
    )
    return result.exit_code, result.stdout.splitlines()


def policy(env: KueueEnv, ns: str, tiers: dict[str, int]) -> dict[str, Any]:
    return {
        "version": "v1",
        "teams": [
            {
                "name": env.name("t"),
                "namespaces": [ns],
                "tiers": {
                    env.name(tier): {"resources": {"nvidia.com/gpu": {"guaranteed": amount}}}
                    for tier, amount in tiers.items()
                },
            }
        ],
    }


def test_apply_creates_then_changes_nothing(env, tmp_path):
    ns = env.namespace("t")
    code, lines = apply(env, policy(env, ns, {"train": 4}), tmp_path)
    assert code == 0, lines
    cq, tier = f"{env.name('t')}-{env.name('train')}", env.name("train")
    assert lines == [
        f"ResourceFlavor {tier}: applied",
        f"Cohort {tier}: applied",
        f"ClusterQueue {cq}: applied",
        f"LocalQueue {ns}/{tier}: applied",
    ]
    managers = {m["manager"] for m in env.cluster_queue(cq)["metadata"]["managedFields"]}
    assert "nodeagent" in managers
    code, lines = apply(env, policy(env, ns, {"train": 4}), tmp_path)
    assert code == 0
    assert all(line.endswith(": unchanged") for line in lines), lines


def test_someone_elses_queue_of_the_same_name_is_left_alone(env, tmp_path):
    ns = env.namespace("t")
    tier = env.name("train")
    theirs = {
        "apiVersion": env.api.api_version,
        "kind": "LocalQueue",
        "metadata": {"name": tier, "namespace": ns},
        "spec": {"clusterQueue": "their-queue"},
    }
    env.plane.apply([theirs])
    code, lines = apply(env, policy(env, ns, {"train": 4}), tmp_path)
    assert code == 1
    assert f"LocalQueue {ns}/{tier}: exists and is not managed by nodeagent; left alone" in lines
    lq = env.custom.get_namespaced_custom_object(
        kueue.GROUP, env.api.version, ns, "localqueues", tier
    )
    assert lq["spec"]["clusterQueue"] == "their-queue"
    assert lq["metadata"].get("labels") is None


def test_a_field_someone_else_changed_is_reported_not_taken_over(env, tmp_path):
    ns = env.namespace("t")
    assert apply(env, policy(env, ns, {"train": 4}), tmp_path)[0] == 0
    cq = f"{env.name('t')}-{env.name('train')}"
    path = ["spec", "resourceGroups", 0, "flavors", 0, "resources", 0, "nominalQuota"]
    env.edit("clusterqueues", cq, path, 6)
    code, lines = apply(env, policy(env, ns, {"train": 8}), tmp_path)
    assert code == 1
    (conflict,) = [line for line in lines if line.startswith(f"ClusterQueue {cq}:")]
    assert conflict.startswith(f"ClusterQueue {cq}: not applied: ")
    assert "kubectl-edit" in conflict
    quota = env.cluster_queue(cq)["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]
    assert str(quota["nominalQuota"]) == "6", "their value stays"


def test_prune_deletes_only_nodeagents_own_objects_the_policy_dropped(env, tmp_path):
    ns = env.namespace("t")
    assert apply(env, policy(env, ns, {"train": 4, "gen": 2}), tmp_path)[0] == 0
    code, lines = apply(env, policy(env, ns, {"train": 4}), tmp_path)
    dropped = f"{env.name('t')}-{env.name('gen')}"
    assert code == 0
    assert (
        f"ClusterQueue {dropped}: managed by nodeagent, not in the policy (kept; --prune "
        "deletes it)"
    ) in lines
    code, lines = apply(env, policy(env, ns, {"train": 4}), tmp_path, "--prune")
    assert code == 0
    pruned = [line for line in lines if line.endswith(": pruned") and env.uid in line]
    assert sorted(pruned) == sorted(
        [
            f"LocalQueue {ns}/{env.name('gen')}: pruned",
            f"ClusterQueue {dropped}: pruned",
            f"Cohort {env.name('gen')}: pruned",
        ]
    )
    assert f"ResourceFlavor {env.name('gen')}: pruned" not in lines, "flavors are the service's"
