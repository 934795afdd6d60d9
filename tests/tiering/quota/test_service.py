"""The tiering service's Kueue side on the real control plane: tiers kept as ResourceFlavors
(never a referenced one deleted, never someone else's edited, hand edits reported as drift),
the dry run, and quota metrics that follow node health."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import yaml
from kubernetes import client
from typer.testing import CliRunner

from nodeagent import labels as lbl
from nodeagent.agent.mig_planning import plan_for_diagnosis
from nodeagent.cli.tiering import app
from nodeagent.published import PublishedGpu, PublishedNode, encode
from nodeagent.testing.clock import FakeClock
from nodeagent.testing.kube.controlplane import ControlPlane, bins_dir
from nodeagent_tiering import service as tiering
from nodeagent_tiering.cluster import kueue
from nodeagent_tiering.cluster.tier_policy import parse_policy
from nodeagent_tiering.quota.apply import apply_objects
from nodeagent_tiering.quota.policy import render
from tests.tiering.quota.conftest import KueueEnv, quota_policy, wait_for


def tier_policy(env: KueueEnv) -> dict[str, Any]:
    """Two tiers of this test's own, over this test's nodes only."""
    return {
        "version": "v1",
        "tiers": [
            {"name": env.name("train"), "selector": {"match_labels": {"role": "train"}}},
            {"name": env.name("gen")},
        ],
        "nodes": {"match_labels": {lbl.POOL: env.uid}},
        "budget": {"cooldown_s": 0},
    }


def build(env: KueueEnv, quota=None, *, dry_run=False, policy=None, api=None):
    return tiering.build(
        api or env.api_client,
        parse_policy(policy or tier_policy(env)),
        namespace=env.ns,
        lease_name="tiering",
        identity="test",
        dry_run=dry_run,
        planner=plan_for_diagnosis,
        # A fraction of a second: the client drops a zero MicroTime fraction, which the API
        # server refuses in a Lease (fixed separately; not what these tests are about).
        clock=FakeClock(1_700_000_000.25),
        quota=quota,
    )


def flavor(env: KueueEnv, name: str) -> dict[str, Any] | None:
    try:
        return env.custom.get_cluster_custom_object(
            kueue.GROUP, env.api.version, "resourceflavors", name
        )
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def gen_products(env: KueueEnv) -> dict[str, Any]:
    return {
        "version": "v1",
        "tiers": {env.name("gen"): {"products": ["NVIDIA-L40S", "NVIDIA-A100-SXM4-80GB"]}},
        "teams": [
            {
                "name": env.name("t"),
                "namespaces": [env.ns],
                "tiers": {
                    env.name("gen"): {
                        "products": {"NVIDIA-L40S": {"nvidia.com/gpu": {"guaranteed": 1}}}
                    }
                },
            }
        ],
    }


def test_the_service_keeps_a_flavor_per_tier_and_per_product(env):
    quota = quota_policy(gen_products(env))
    service = build(env, quota)
    tiering.run_once(service)
    train = flavor(env, env.name("train"))
    assert train is not None
    assert train["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "nodeagent",
        "nodeagent.io/tier": env.name("train"),
    }
    assert train["spec"] == {"nodeLabels": {"nodeagent.io/tier": env.name("train")}}
    l40s = flavor(env, f"{env.name('gen')}-nvidia-l40s")
    assert l40s is not None
    assert l40s["spec"]["nodeLabels"] == {
        "nodeagent.io/tier": env.name("gen"),
        "nvidia.com/gpu.product": "NVIDIA-L40S",
    }
    assert flavor(env, f"{env.name('gen')}-nvidia-a100-sxm4-80gb") is not None
    assert flavor(env, env.name("gen")) is None, "a split tier has no flavor of its own"
    fields = [m["manager"] for m in train["metadata"]["managedFields"]]
    assert fields == ["nodeagent"], "written by server-side apply as nodeagent"
    registry = service.controller.metrics.registry
    assert registry.get_sample_value("nodeagent_tiering_kueue_served") == 1
    assert registry.get_sample_value("nodeagent_tiering_kueue_flavors", {"state": "in-sync"}) >= 3
    # Nothing changes on a second pass.
    version = train["metadata"]["resourceVersion"]
    tiering.run_once(service)
    assert env.name("train") in service.kueue.last_report.unchanged
    assert flavor(env, env.name("train"))["metadata"]["resourceVersion"] == version


def test_a_flavor_no_tier_wants_is_deleted_only_once_no_queue_names_it(env):
    service = build(env)
    tiering.run_once(service)
    old = {
        "apiVersion": env.api.api_version,
        "kind": "ResourceFlavor",
        "metadata": {"name": env.name("old"), "labels": {lbl.MANAGED_BY: lbl.MANAGED_BY_VALUE}},
        "spec": {"nodeLabels": {lbl.TIER: env.name("old")}},
    }
    env.plane.apply([old, env.foreign_cluster_queue("user", env.name("old"), 1)])
    tiering.run_once(service)
    report = service.kueue.last_report
    assert report.kept[env.name("old")] == [env.name("user")]
    assert env.name("old") not in report.deleted
    assert flavor(env, env.name("old")) is not None
    env.plane.kubectl("delete", "clusterqueue.kueue.x-k8s.io", env.name("user"))
    tiering.run_once(service)
    assert env.name("old") in service.kueue.last_report.deleted
    # Kueue lifts its resource-in-use finalizer once it too sees no queue naming the flavor.
    wait_for(lambda: flavor(env, env.name("old")) is None, what="the flavor to go")


def test_someone_elses_flavor_of_the_same_name_is_never_touched(env):
    theirs = {
        "apiVersion": env.api.api_version,
        "kind": "ResourceFlavor",
        "metadata": {"name": env.name("train"), "labels": {"owner": "platform"}},
        "spec": {"nodeLabels": {"pool": "a100"}},
    }
    env.plane.apply([theirs])
    before = flavor(env, env.name("train"))
    service = build(env)
    tiering.run_once(service)
    report = service.kueue.last_report
    assert env.name("train") in report.foreign
    after = flavor(env, env.name("train"))
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert after["spec"] == {"nodeLabels": {"pool": "a100"}}
    registry = service.controller.metrics.registry
    assert registry.get_sample_value("nodeagent_tiering_kueue_flavors", {"state": "name-taken"})


def test_a_hand_edit_is_reported_as_drift_and_left_as_it_is(env, caplog):
    service = build(env)
    tiering.run_once(service)
    name = env.name("train")
    env.edit("resourceflavors", name, ["spec", "nodeLabels", lbl.TIER], "elsewhere")
    with caplog.at_level(logging.WARNING, logger="nodeagent_tiering.quota.flavors"):
        tiering.run_once(service)
    report = service.kueue.last_report
    assert "spec.nodeLabels changed by kubectl-edit" in report.drifted[name]
    assert flavor(env, name)["spec"]["nodeLabels"][lbl.TIER] == "elsewhere", "not overwritten"
    assert any(name in r.getMessage() and "kubectl-edit" in r.getMessage() for r in caplog.records)
    registry = service.controller.metrics.registry
    labels = {"flavor": name, "tier": name}
    assert registry.get_sample_value("nodeagent_tiering_kueue_flavor_drift", labels) == 1
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="nodeagent_tiering.quota.flavors"):
        tiering.run_once(service)
    assert not caplog.records, "the same drift is logged once"
    # The review says so too.
    result = CliRunner().invoke(
        app,
        [
            "report",
            "--kubeconfig",
            str(env.plane.admin.path),
            "--json",
            "--policy",
            str(_write(env, tier_policy(env))),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "kubectl-edit" in yaml.safe_load(result.stdout)["quota"]["drifted_flavors"][name]
    # Put back by hand: in sync again, the gauge clears.
    env.edit("resourceflavors", name, ["spec", "nodeLabels", lbl.TIER], name)
    tiering.run_once(service)
    assert name in service.kueue.last_report.unchanged
    assert registry.get_sample_value("nodeagent_tiering_kueue_flavor_drift", labels) is None


def _write(env: KueueEnv, data: dict[str, Any]):
    path = env.plane.workdir / f"policy-{env.uid}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_dry_run_prints_the_flavors_and_writes_none(env):
    result = CliRunner().invoke(
        app,
        [
            "run",
            "--policy",
            str(_write(env, tier_policy(env))),
            "--kubeconfig",
            str(env.plane.admin.path),
            "--namespace",
            env.ns,
            "--dry-run",
            "--once",
        ],
    )
    assert result.exit_code == 0, result.output
    assert f"would create ResourceFlavor {env.name('train')}" in result.stdout
    flavors = result.stdout.split("# the ResourceFlavors the service keeps:\n", 1)[1]
    docs = [d for d in yaml.safe_load_all(flavors) if d]
    assert {d["metadata"]["name"] for d in docs} == {env.name("train"), env.name("gen")}
    assert flavor(env, env.name("train")) is None


def test_quota_metrics_follow_node_health(env):
    train = env.name("train")
    for n in ("a", "b"):
        env.node(n, None, labels={lbl.POOL: env.uid, "role": "train"})
    data = {
        "version": "v1",
        "teams": [
            {
                "name": env.name("t"),
                "namespaces": [env.ns],
                "tiers": {train: {"resources": {"nvidia.com/gpu": {"guaranteed": 12}}}},
            }
        ],
    }
    assert apply_objects(env.kube, env.api, render(quota_policy(data), env.api)).ok
    service = build(env)
    tiering.run_once(service)  # labels the nodes with their tier
    tiering.run_once(service)  # measures them labelled
    registry = service.controller.metrics.registry
    key = {"tier": train, "flavor": train, "resource": "nvidia.com/gpu"}

    def value(name: str, **extra: str) -> float | None:
        return registry.get_sample_value(name, {**key, **extra})

    assert value("nodeagent_tiering_quota_guaranteed") == 12
    assert value("nodeagent_tiering_quota_capacity", state="healthy") == 16
    assert value("nodeagent_tiering_quota_backed") == 12
    # The agents flag node b unstable: before any drain, its GPUs stop backing quota.
    env.core.patch_node_status(
        env.name("b"),
        {
            "status": {
                "conditions": [
                    {
                        "type": "GPUHealthy",
                        "status": "False",
                        "reason": "Xid79",
                        "message": "xid 79 on GPU 3",
                    }
                ]
            }
        },
    )
    # Measured before the next reconcile pass would start a drain.
    service.cache.relist()
    service.kueue.after_pass(service.cache.snapshot(), force=True)
    assert value("nodeagent_tiering_quota_capacity", state="installed") == 16
    assert value("nodeagent_tiering_quota_capacity", state="healthy") == 8
    assert value("nodeagent_tiering_quota_backed") == 8
    # The service drains it: it leaves the tier's label, and still counts as installed.
    tiering.run_once(service)  # starts the drain
    node = env.core.read_node(env.name("b"))
    assert node.metadata.labels[lbl.TIER] == "quarantine"
    tiering.run_once(service)
    assert value("nodeagent_tiering_quota_capacity", state="installed") == 16
    assert value("nodeagent_tiering_quota_backed") == 8


@pytest.fixture(scope="module")
def plane_without_kueue():
    plane = ControlPlane(bins=bins_dir())
    plane.start()
    yield plane
    plane.stop()


def test_without_kueue_the_service_keeps_no_flavors_and_quota_commands_say_why(
    plane_without_kueue, tmp_path
):
    plane = plane_without_kueue
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump({"version": "v1", "tiers": [{"name": "training"}]}))
    service = tiering.build(
        plane.api_client(),
        parse_policy(yaml.safe_load(policy.read_text())),
        namespace="default",
        lease_name="tiering",
        identity="test",
        dry_run=False,
        planner=plan_for_diagnosis,
        # A fraction of a second: the client drops a zero MicroTime fraction, which the API
        # server refuses in a Lease (fixed separately; not what these tests are about).
        clock=FakeClock(1_700_000_000.25),
    )
    tiering.run_once(service)
    registry = service.controller.metrics.registry
    assert registry.get_sample_value("nodeagent_tiering_kueue_served") == 0
    assert service.kueue.api is None
    quota = tmp_path / "quota.yaml"
    quota.write_text(
        "version: v1\nteams:\n  - name: ml\n    namespaces: [ml]\n    tiers:\n"
        "      training: {resources: {nvidia.com/gpu: {guaranteed: 1}}}\n"
    )
    for args in (["check"], ["render", "--apply"]):
        result = CliRunner().invoke(
            app, ["quota", *args, "-f", str(quota), "--kubeconfig", str(plane.admin.path)]
        )
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith("error: the cluster serves no Kueue API"), result.stderr
        assert "Traceback" not in result.output


def test_quota_is_backed_gpu_by_gpu_in_the_metrics_and_quota_check(env, tmp_path):
    # Issue 27 item 2: one GPU with an XID 48 on each of two nodes costs two GPUs of backing,
    # not sixteen, while single-GPU remediation keeps the other seven of each serving.
    train = env.name("train")
    bad = PublishedNode(
        tuple(
            PublishedGpu(
                index=i, model="NVIDIA H100 80GB HBM3", health="unhealthy" if i == 3 else "healthy"
            )
            for i in range(8)
        ),
        {},
        True,
    )
    for n in ("a", "b"):
        env.node(n, None, labels={lbl.POOL: env.uid, "role": "train"})
    data = {
        "version": "v1",
        "teams": [
            {
                "name": env.name("t"),
                "namespaces": [env.ns],
                "tiers": {train: {"resources": {"nvidia.com/gpu": {"guaranteed": 16}}}},
            }
        ],
    }
    assert apply_objects(env.kube, env.api, render(quota_policy(data), env.api)).ok
    policy = {**tier_policy(env), "gpu_remediation": {"enabled": True}}
    service = build(env, policy=policy)
    tiering.run_once(service)
    tiering.run_once(service)
    for n, allocatable in (("a", "8"), ("b", "7")):  # b's kubelet already lowered allocatable
        name = env.name(n)
        env.core.patch_node(
            name, {"metadata": {"annotations": {lbl.GPU_STATE_ANNOTATION: encode(bad)}}}
        )
        env.core.patch_node_status(
            name,
            {
                "status": {
                    "allocatable": {"nvidia.com/gpu": allocatable},
                    "conditions": [
                        {
                            "type": "GPUHealthy",
                            "status": "False",
                            "reason": "Xid48",
                            "message": "GPU 3: double-bit ECC error",
                        }
                    ],
                }
            },
        )
    tiering.run_once(service)
    tiering.run_once(service)
    for n in ("a", "b"):  # remediation: the nodes stay in their tier
        assert env.core.read_node(env.name(n)).metadata.labels[lbl.TIER] == train
    registry = service.controller.metrics.registry
    key = {"tier": train, "flavor": train, "resource": "nvidia.com/gpu"}
    assert (
        registry.get_sample_value("nodeagent_tiering_quota_capacity", {**key, "state": "installed"})
        == 16
    )
    assert (
        registry.get_sample_value("nodeagent_tiering_quota_capacity", {**key, "state": "healthy"})
        == 14
    )
    assert registry.get_sample_value("nodeagent_tiering_quota_backed", key) == 14

    path = tmp_path / "quota.yaml"
    path.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(
        app, ["quota", "check", "-f", str(path), "--kubeconfig", str(env.plane.admin.path)]
    )
    assert result.exit_code == 1, result.stdout
    assert (
        f"the tier promises 16 and its healthy nodes hold 14 of 16 ({env.name('a')} GPU 3 "
        f"unhealthy; {env.name('b')} GPU 3 unhealthy): 2 not backed"
    ) in result.stdout


def test_the_service_keeps_the_reserved_node_marked_and_says_how_many(env):
    train = env.name("train")
    quota = quota_policy(
        {
            "version": "v1",
            "tiers": {train: {"reserve": {"nodes": 1, "teams": [env.name("t")]}}},
            "teams": [
                {
                    "name": env.name("t"),
                    "namespaces": [env.ns],
                    "tiers": {train: {"resources": {"nvidia.com/gpu": {"guaranteed": 8}}}},
                }
            ],
        }
    )
    labels = {lbl.POOL: env.uid, "role": "train"}
    first, second = env.node("a", None, labels=labels), env.node("b", None, labels=labels)
    service = build(env, quota)
    tiering.run_once(service)  # the tier labels first, then the reserve over them
    marked = {n: env.core.read_node(n).metadata.labels.get(lbl.RESERVED) for n in (first, second)}
    assert marked == {first: lbl.RESERVED_VALUE, second: None}
    assert [t.key for t in env.core.read_node(first).spec.taints] == [lbl.RESERVED]
    registry = service.controller.metrics.registry
    for state, value in (("wanted", 1), ("kept", 1)):
        sample = {"tier": train, "state": state}
        assert registry.get_sample_value("nodeagent_tiering_reserved_nodes", sample) == value
    assert flavor(env, f"{train}-reserved")["spec"]["nodeLabels"] == {
        lbl.TIER: train,
        lbl.RESERVED: lbl.RESERVED_VALUE,
    }
