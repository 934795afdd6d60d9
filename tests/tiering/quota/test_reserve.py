"""Capacity reserved for large jobs and lent while idle: the policy, what it renders for Kueue,
and which nodes the service keeps (the proof with the real Kueue is in test_reserve_kueue.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nodeagent import labels as lbl
from nodeagent_tiering.cluster import kueue
from nodeagent_tiering.cluster.nodes import Node
from nodeagent_tiering.quota.policy import QuotaPolicyError, load_quota_policy, render
from nodeagent_tiering.quota.reserve import ReserveSpec, choose_reserved, marking_patch
from nodeagent_tiering.quota.templates import admission_objects
from tests.tiering.pending.builders import Cluster
from tests.tiering.quota.conftest import quota_policy

API = kueue.KueueApi("v1beta2")
GPU = "nvidia.com/gpu"


def policy(**reserve: Any) -> dict[str, Any]:
    return {
        "version": "v1",
        "tiers": {"training": {"reserve": {"nodes": 2, "teams": ["research"], **reserve}}},
        "teams": [
            {
                "name": "vision",
                "namespaces": ["vision"],
                "tiers": {"training": {"resources": {GPU: {"guaranteed": 16}}}},
            },
            {
                "name": "research",
                "namespaces": ["research", "research-dev"],
                "tiers": {"training": {"resources": {GPU: {"guaranteed": 8}}}},
            },
        ],
    }


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {
        f"{o['metadata'].get('namespace', '')}/{o['metadata']['name']}".lstrip("/"): o
        for o in objects
        if o["kind"] == kind
    }


def test_the_reserve_renders_a_flavor_a_queue_that_owns_it_and_borrowing_for_the_rest() -> None:
    objects = render(quota_policy(policy()), API)
    flavors = by_kind(objects, "ResourceFlavor")
    taint = {"key": lbl.RESERVED, "value": lbl.RESERVED_VALUE, "effect": "NoSchedule"}
    assert flavors["training-reserved"]["spec"] == {
        "nodeLabels": {lbl.TIER: "training", lbl.RESERVED: lbl.RESERVED_VALUE},
        "nodeTaints": [taint],
        "tolerations": [{**taint, "operator": "Equal"}],
    }
    assert flavors["training"]["spec"] == {"nodeLabels": {lbl.TIER: "training"}}

    queues = by_kind(objects, "ClusterQueue")
    reserved = queues["training-reserved"]["spec"]
    assert reserved[API.cohort_field] == "training"
    assert reserved["preemption"] == {"reclaimWithinCohort": "Any", "withinClusterQueue": "Never"}
    assert reserved["namespaceSelector"]["matchExpressions"][0]["values"] == [
        "research",
        "research-dev",
    ]
    (group,) = reserved["resourceGroups"]
    assert group["flavors"] == [
        {
            "name": "training-reserved",
            "resources": [{"name": GPU, "nominalQuota": 16, "borrowingLimit": 0}],
        }
    ]
    # Every team of the tier may borrow the reserved nodes, after its own flavor.
    for team in ("vision-training", "research-training"):
        (group,) = queues[team]["spec"]["resourceGroups"]
        assert [f["name"] for f in group["flavors"]] == ["training", "training-reserved"]
        assert group["flavors"][1]["resources"] == [{"name": GPU, "nominalQuota": 0}]

    local = by_kind(objects, "LocalQueue")
    assert local["research/training-large"]["spec"] == {"clusterQueue": "training-reserved"}
    assert local["research-dev/training-large"]["spec"] == {"clusterQueue": "training-reserved"}
    assert "vision/training-large" not in local


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"teams": ["nobody"]}, "tiers.training.reserve.teams.0: no team nobody in teams"),
        ({"queue": "Large_Jobs"}, "tiers.training.reserve.queue: LocalQueue name 'Large_Jobs'"),
        ({"queue": "training"}, "LocalQueue research/training is also"),
        ({"nodes": 0}, "tiers.training.reserve.nodes: Input should be greater than or equal to 1"),
        ({"gpus": "8"}, "tiers.training.reserve.gpus: Input should be a valid integer"),
    ],
)
def test_a_bad_reserve_is_a_line_naming_the_field(change, expected) -> None:
    with pytest.raises(QuotaPolicyError) as err:
        quota_policy(policy(**change))
    assert expected in str(err.value)
    # One line per problem (a LocalQueue taken in two namespaces is two), each naming the field.
    assert all(line.startswith("<quota policy>:") for line in str(err.value).splitlines())


def nodes(cluster: Cluster, **labels: dict[str, str]) -> list[Node]:
    for obj in cluster.nodes:
        obj["metadata"]["labels"].update(labels.get(obj["metadata"]["name"], {}))
    return [Node.from_object(o) for o in cluster.nodes]


def test_the_emptiest_whole_nodes_are_kept_and_those_kept_stay_kept() -> None:
    cluster = (
        Cluster()
        .whole("busy", used=[3, 2])
        .whole("empty")
        .whole("half", used=[4])
        .whole("cordoned", unschedulable=True)
        .whole("split", islands=[0, 0, 0, 0, 4, 4, 4, 4])
        .whole("small", gpus=4)
        .whole("other-tier", tier="general")
        .whole("degraded")
    )
    spec = ReserveSpec("training", nodes=2, gpus=8)
    choice = choose_reserved(nodes(cluster, degraded={lbl.STABILITY: "degraded"}), spec)
    assert choice.kept == ("empty", "half")
    assert choice.refused == {
        "cordoned": "cordoned",
        "split": "largest NVLink island 4 GPUs, 8 needed",
        "small": "4 whole GPUs allocatable, 8 needed",
        "degraded": "degraded",
    }
    # Once kept, a node stays kept though an emptier one appears (moving the reserve would
    # strand what was lent there), until it can no longer be.
    again = choose_reserved(nodes(cluster, busy={lbl.RESERVED: lbl.RESERVED_VALUE}), spec)
    assert again.kept == ("busy", "empty")
    failed = nodes(cluster, busy={lbl.RESERVED: lbl.RESERVED_VALUE, lbl.STABILITY: "unstable"})
    replaced = choose_reserved(failed, spec)
    assert replaced.kept == ("empty", "half")
    assert replaced.refused["busy"] == "unstable"
    short = choose_reserved(failed, ReserveSpec("training", nodes=4, gpus=8))
    assert short.short == 2


def test_marking_adds_the_label_and_taint_and_keeps_other_taints() -> None:
    cluster = Cluster().whole(
        "n", taints=[{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]
    )
    (node,) = nodes(cluster)
    patch = marking_patch(node, True)
    assert patch is not None
    assert patch["metadata"]["labels"] == {lbl.RESERVED: lbl.RESERVED_VALUE}  # type: ignore[index]
    assert patch["spec"]["taints"] == [  # type: ignore[index]
        {"key": "dedicated", "value": "ml", "effect": "NoSchedule"},
        {"key": lbl.RESERVED, "value": lbl.RESERVED_VALUE, "effect": "NoSchedule"},
    ]
    assert marking_patch(node, False) is None  # not marked: nothing to undo


def test_the_shipped_reserve_example_loads_and_renders() -> None:
    path = Path(__file__).parents[3] / "docs" / "examples" / "quota-reserve.yaml"
    objects = render(load_quota_policy(path), API)
    assert "research/training-large" in by_kind(objects, "LocalQueue")
    reserved = by_kind(objects, "ClusterQueue")["training-reserved"]
    (group,) = reserved["spec"]["resourceGroups"]
    assert group["flavors"][0]["resources"][0]["nominalQuota"] == 8


def test_the_reserves_queue_gets_a_hard_whole_node_template() -> None:
    objects = admission_objects(quota_policy(policy()))
    policies = by_kind(objects, "ValidatingAdmissionPolicy")
    rule = policies["nodeagent-templates-training-reserved"]["spec"]
    assert rule["failurePolicy"] == "Fail"
    (condition,) = rule["matchConditions"]
    assert '["research/training-large", "research-dev/training-large"]' in condition["expression"]
    binding = by_kind(objects, "ValidatingAdmissionPolicyBinding")
    assert binding["nodeagent-templates-training-reserved"]["spec"]["validationActions"] == ["Deny"]
