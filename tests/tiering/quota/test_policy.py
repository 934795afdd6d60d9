"""The quota policy: what each setting becomes in a ClusterQueue, exactly; what the loader
refuses, in one line naming the file, the line and the field; and what the real API server and
Kueue's webhooks make of the rendered objects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from nodeagent.cli.tiering import app
from nodeagent_tiering.cluster import kueue
from nodeagent_tiering.quota.apply import apply_objects
from nodeagent_tiering.quota.policy import QuotaPolicyError, parse_quota_policy, render
from tests.tiering.quota.conftest import quota_policy

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "docs" / "examples" / "quota-policy.yaml"
V1BETA2 = kueue.KueueApi("v1beta2")
SELECT_ML = {
    "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["ml"]}]
}


def one_team(tier: dict[str, Any], settings: dict[str, Any] | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {
        "version": "v1",
        "teams": [{"name": "ml", "namespaces": ["ml"], "tiers": {"training": tier}}],
    }
    if settings is not None:
        data["tiers"] = {"training": settings}
    return data


def gpu(entry: dict[str, Any]) -> dict[str, Any]:
    return {"resources": {"nvidia.com/gpu": entry}}


def group(*flavors: tuple[str, list[dict[str, Any]]], covered: list[str] | None = None):
    covered = covered or [r["name"] for r in flavors[0][1]]
    return [
        {
            "coveredResources": covered,
            "flavors": [{"name": name, "resources": res} for name, res in flavors],
        }
    ]


def training(*quotas: dict[str, Any]):
    """The resource group of the one flavor ``training`` with these resources' quotas."""
    return group(("training", list(quotas)))


def quota(resource: str = "nvidia.com/gpu", **fields: int) -> dict[str, Any]:
    """One resource's entry in a ClusterQueue flavor: its name, then the quota fields."""
    return {"name": resource, **fields}


CASES = [
    pytest.param(
        gpu({"guaranteed": 8, "type": "hard"}),
        None,
        "Never",
        training(quota(nominalQuota=8, borrowingLimit=0, lendingLimit=0)),
        id="hard: never lent (lendingLimit 0), no borrowing by default",
    ),
    pytest.param(
        gpu({"guaranteed": 8}),
        None,
        "Never",
        training(quota(nominalQuota=8, borrowingLimit=0)),
        id="soft by default: lendable (no lendingLimit)",
    ),
    pytest.param(
        gpu({"guaranteed": 8, "lend": 2}),
        None,
        "Never",
        training(quota(nominalQuota=8, borrowingLimit=0, lendingLimit=2)),
        id="soft with a lending limit",
    ),
    pytest.param(
        gpu({"guaranteed": 4, "borrow": 4}),
        None,
        "Never",
        training(quota(nominalQuota=4, borrowingLimit=4)),
        id="borrow limit",
    ),
    pytest.param(
        gpu({"guaranteed": 0, "borrow": "unlimited"}),
        None,
        "Never",
        training(quota(nominalQuota=0)),
        id="opportunistic: nothing guaranteed, unlimited borrowing",
    ),
    pytest.param(
        {"reclaimable": True, **gpu({"guaranteed": 16, "borrow": 8})},
        None,
        "Any",
        training(quota(nominalQuota=16, borrowingLimit=8)),
        id="reclaimable: preempt borrowers to take lent quota back",
    ),
    pytest.param(
        {
            "resources": {
                "nvidia.com/mig-3g.40gb": {"guaranteed": 2},
                "nvidia.com/gpu": {"guaranteed": 4, "type": "hard"},
                "nvidia.com/mig-1g.10gb": {"guaranteed": 14, "borrow": 7},
            }
        },
        None,
        "Never",
        training(
            quota(nominalQuota=4, borrowingLimit=0, lendingLimit=0),
            quota("nvidia.com/mig-1g.10gb", nominalQuota=14, borrowingLimit=7),
            quota("nvidia.com/mig-3g.40gb", nominalQuota=2, borrowingLimit=0),
        ),
        id="MIG profiles are resources of their own, whole GPUs first, then by size",
    ),
    pytest.param(
        {
            "products": {
                "NVIDIA-H200": {"nvidia.com/gpu": {"guaranteed": 8, "borrow": 8}},
                "NVIDIA-H100-80GB-HBM3": {
                    "nvidia.com/gpu": {"guaranteed": 4},
                    "nvidia.com/mig-1g.10gb": {"guaranteed": 7},
                },
            }
        },
        {"products": ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H200", "NVIDIA-A100-SXM4-80GB"]},
        "Never",
        group(
            (
                "training-nvidia-h100-80gb-hbm3",
                [
                    quota(nominalQuota=4, borrowingLimit=0),
                    quota("nvidia.com/mig-1g.10gb", nominalQuota=7, borrowingLimit=0),
                ],
            ),
            (
                "training-nvidia-h200",
                [
                    quota(nominalQuota=8, borrowingLimit=8),
                    quota("nvidia.com/mig-1g.10gb", nominalQuota=0, borrowingLimit=0),
                ],
            ),
        ),
        id="a flavor per product, in the tier's order; only the products the team has",
    ),
]


@pytest.mark.parametrize(("tier", "settings", "reclaim", "groups"), CASES)
def test_policy_renders_to_exact_cluster_queue_fields(tier, settings, reclaim, groups):
    objects = render(quota_policy(one_team(tier, settings)), V1BETA2)
    (cq,) = [o for o in objects if o["kind"] == "ClusterQueue"]
    assert cq["metadata"]["name"] == "ml-training"
    assert cq["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "nodeagent",
        "nodeagent.io/team": "ml",
        "nodeagent.io/tier": "training",
    }
    assert cq["spec"] == {
        "cohortName": "training",
        "namespaceSelector": SELECT_ML,
        "preemption": {"reclaimWithinCohort": reclaim},
        "resourceGroups": groups,
    }


def test_each_tier_is_one_cohort_and_each_namespace_gets_a_local_queue_per_tier():
    data = {
        "version": "v1",
        "tiers": {"general": {"cohort": "general-pool"}},
        "teams": [
            {
                "name": "ml",
                "namespaces": ["ml-a", "ml-b"],
                "local_queues": [{"namespace": "ml-legacy", "name": "gpu", "tier": "general"}],
                "tiers": {
                    "training": gpu({"guaranteed": 8}),
                    "general": {"queue": "batch", **gpu({"guaranteed": 2})},
                },
            },
            {"name": "web", "namespaces": ["web"], "tiers": {"general": gpu({"guaranteed": 1})}},
        ],
    }
    objects = render(quota_policy(data), V1BETA2)
    kinds = [o["kind"] for o in objects]
    order = ["ResourceFlavor", "Cohort", "ClusterQueue", "LocalQueue"]
    assert kinds == sorted(kinds, key=order.index)
    cohorts = {o["metadata"]["name"] for o in objects if o["kind"] == "Cohort"}
    assert cohorts == {"training", "general-pool"}
    cqs = {
        o["metadata"]["name"]: o["spec"]["cohortName"]
        for o in objects
        if o["kind"] == "ClusterQueue"
    }
    assert cqs == {
        "ml-training": "training",
        "ml-general": "general-pool",
        "web-general": "general-pool",
    }
    lqs = {
        (o["metadata"]["namespace"], o["metadata"]["name"]): o["spec"]["clusterQueue"]
        for o in objects
        if o["kind"] == "LocalQueue"
    }
    assert lqs == {
        ("ml-a", "training"): "ml-training",
        ("ml-b", "training"): "ml-training",
        ("ml-a", "batch"): "ml-general",
        ("ml-b", "batch"): "ml-general",
        ("ml-legacy", "gpu"): "ml-general",
        ("web", "general"): "web-general",
    }
    ml = next(o for o in objects if o["metadata"]["name"] == "ml-general")
    values = ml["spec"]["namespaceSelector"]["matchExpressions"][0]["values"]
    assert values == ["ml-a", "ml-b", "ml-legacy"]


def test_v1beta1_names_the_cohort_with_cohort():
    policy = quota_policy(one_team(gpu({"guaranteed": 1})))
    (cq,) = [o for o in render(policy, kueue.KueueApi("v1beta1")) if o["kind"] == "ClusterQueue"]
    assert cq["apiVersion"] == "kueue.x-k8s.io/v1beta1"
    assert cq["spec"]["cohort"] == "training"
    assert "cohortName" not in cq["spec"]


def test_without_served_cohort_objects_none_are_rendered():
    policy = quota_policy(one_team(gpu({"guaranteed": 1})))
    api = kueue.KueueApi("v1beta1", frozenset({"resourceflavors", "clusterqueues", "localqueues"}))
    assert "Cohort" not in {o["kind"] for o in render(policy, api)}


BAD = [
    pytest.param(
        "version: v2\nteams: []\n",
        ":1: version: unsupported version 'v2' (known: v1)",
        id="version",
    ),
    pytest.param(
        "version: v1\nteams:\n  - name: ml\n    namespaces: [ml]\n    tiers:\n      t:\n"
        "        resources:\n          nvidia.com/gpu: {guaranted: 3}\n",
        ":8: teams.0.tiers.t.resources.nvidia.com/gpu.guaranted: unknown field (known: "
        "guaranteed, type, borrow, lend)",
        id="unknown field",
    ),
    pytest.param(
        "version: v1\nteams:\n  - name: ml\n    namespaces: [ml]\n    tiers:\n      t:\n"
        "        resources:\n          nvidia.com/gpu: {guaranteed: '3'}\n",
        ":8: teams.0.tiers.t.resources.nvidia.com/gpu.guaranteed: Input should be a valid integer",
        id="a string is not a number",
    ),
    pytest.param(
        "version: v1\nteams:\n  - name: ml\n    namespaces: [ml]\n    tiers:\n      t:\n"
        "        resources:\n          nvidia.com/gpu: {guaranteed: 3, borrow: lots}\n",
        ":8: teams.0.tiers.t.resources.nvidia.com/gpu.borrow: must be a whole number of devices "
        "(0 to 2^63-1, Kubernetes' largest quantity) or 'unlimited'",
        id="borrow",
    ),
    pytest.param(
        "version: v1\nteams:\n  - name: ml\n    namespaces: [ml]\n    tiers:\n      t:\n"
        "        resources:\n          nvidia.com/gpu: {guaranteed: 3, type: hard, lend: 1}\n",
        ":8: teams.0.tiers.t.resources.nvidia.com/gpu.lend: a hard quota is never lent; drop lend",
        id="hard and lend",
    ),
    pytest.param(
        "version: v1\nteams:\n  - name: ml\n    namespaces: [ml]\n    tiers:\n      t:\n"
        "        resources:\n          cpu: {guaranteed: 3}\n",
        ":8: teams.0.tiers.t.resources.cpu: not a GPU resource",
        id="not a GPU resource",
    ),
    pytest.param(
        "version: v1\nteams:\n  - name: ml\n    namespaces: [ml]\n    tiers:\n"
        "      t: {resources: {nvidia.com/gpu: {guaranteed: 1}}}\n"
        "  - name: web\n    namespaces: [ml]\n    tiers:\n"
        "      t: {resources: {nvidia.com/gpu: {guaranteed: 1}}}\n",
        ":8: teams.1.namespaces.0: namespace ml is team ml's",
        id="a namespace belongs to one team",
    ),
    pytest.param(
        "version: v1\nteams:\n  - name: ml\n    namespaces: [ml]\n    tiers:\n"
        "      gpu-fast: {resources: {nvidia.com/gpu: {guaranteed: 1}}}\n",
        ":6: teams.0.tiers.gpu-fast: tier gpu-fast is not in the tier policy (tiers: general, "
        "shared, training)",
        id="a tier the tier policy does not have",
    ),
    pytest.param(
        "version: v1\ntiers:\n  training: {products: [NVIDIA-H200]}\nteams:\n  - name: ml\n"
        "    namespaces: [ml]\n    tiers:\n"
        "      training: {resources: {nvidia.com/gpu: {guaranteed: 1}}}\n",
        ":8: teams.0.tiers.training.resources: tier training has a flavor per product",
        id="per-product tier needs per-product quota",
    ),
    # Names and numbers the API server would refuse, caught when the file is read (issue 32).
    pytest.param(
        "version: v1\nteams:\n  - name: ml\n    namespaces: [ml]\n    tiers:\n"
        "      Bad Tier: {resources: {nvidia.com/gpu: {guaranteed: 1}}}\n",
        ":6: teams.0.tiers.Bad Tier: tier name: 'Bad Tier' must be a valid label value",
        id="a tier name that is no label value",
    ),
    pytest.param(
        "version: v1\ntiers:\n  'Bad Tier': {}\nteams:\n  - name: ml\n    namespaces: [ml]\n"
        "    tiers:\n      t: {resources: {nvidia.com/gpu: {guaranteed: 1}}}\n",
        ":3: tiers.Bad Tier: tier name: 'Bad Tier' must be a valid label value",
        id="a tier setting's name that is no label value",
    ),
    pytest.param(
        "version: v1\nteams:\n  - name: ml\n    namespaces: [ml]\n    tiers:\n      t:\n"
        f"        resources:\n          nvidia.com/gpu: {{guaranteed: {10**30}}}\n",
        ":8: teams.0.tiers.t.resources.nvidia.com/gpu.guaranteed: Input should be less than or "
        f"equal to {2**63 - 1}",
        id="a nominalQuota beyond int64",
    ),
    pytest.param(
        "version: v1\ntiers:\n  t: {taints: [{key: '!!bad key', effect: NoSchedule}]}\n"
        "teams:\n  - name: ml\n    namespaces: [ml]\n"
        "    tiers:\n      t: {resources: {nvidia.com/gpu: {guaranteed: 1}}}\n",
        ":3: tiers.t.taints.0.key: '!!bad key' is not a valid label key",
        id="a taint key that is no label key",
    ),
    pytest.param(
        "version: v1\ntiers:\n  t: {products: [NVIDIA H100]}\nteams:\n  - name: ml\n"
        "    namespaces: [ml]\n    tiers:\n"
        "      t: {products: {NVIDIA H100: {nvidia.com/gpu: {guaranteed: 1}}}}\n",
        ":3: tiers.t.products.0: 'NVIDIA H100' must be a valid label value",
        id="a product that is no label value",
    ),
    pytest.param(
        "version: v1\ntiers:\n  t: {cohort: Big_Cohort}\nteams:\n  - name: ml\n"
        "    namespaces: [ml]\n    tiers:\n"
        "      t: {resources: {nvidia.com/gpu: {guaranteed: 1}}}\n",
        ":3: tiers.t.cohort: 'Big_Cohort' is not a valid cohort name",
        id="a cohort that is no object name",
    ),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_bad_policy_is_one_line_per_problem_naming_file_line_and_field(text, message, tmp_path):
    path = tmp_path / "quota.yaml"
    path.write_text(text)
    result = CliRunner().invoke(
        app, ["quota", "render", "-f", str(path), "--policy", str(tier_policy(tmp_path))]
    )
    assert result.exit_code == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors, result.stderr
    assert any(e.startswith(f"error: {path}{message}") for e in errors), errors
    assert result.stderr.splitlines()[-1].startswith("hint: ")
    assert "Traceback" not in result.output


def tier_policy(tmp_path: Path) -> Path:
    config = yaml.safe_load((REPO / "deploy/kubernetes/tiering/configmap.yaml").read_text())
    path = tmp_path / "policy.yaml"
    path.write_text(config["data"]["policy.yaml"])
    return path


def test_example_renders_for_the_shipped_tiers_as_multi_document_yaml(tmp_path):
    result = CliRunner().invoke(
        app, ["quota", "render", "-f", str(EXAMPLE), "--policy", str(tier_policy(tmp_path))]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("---\n")
    docs = list(yaml.safe_load_all(result.stdout))
    teams = {d["metadata"]["labels"].get("nodeagent.io/team") for d in docs} - {None}
    assert teams == {"llm", "search", "research"}
    tiers = {d["metadata"]["labels"]["nodeagent.io/tier"] for d in docs}
    assert tiers == {"training", "general", "shared"}


def test_quota_errors_exit_2_without_a_policy_file(tmp_path):
    result = CliRunner().invoke(app, ["quota", "render", "-f", str(tmp_path / "absent.yaml")])
    assert result.exit_code == 2
    assert "absent.yaml: no such file; check the path" in result.stderr


def test_parse_errors_list_every_problem():
    with pytest.raises(QuotaPolicyError) as bad:
        parse_quota_policy(
            "version: v1\nteams:\n  - name: ML\n    tiers:\n"
            "      t: {resources: {nvidia.com/gpu: {guaranteed: 1}}}\n"
        )
    lines = str(bad.value).splitlines()
    assert any("teams.0.name: 'ML' is not a DNS label" in line for line in lines)
    assert any("list its namespaces or local_queues" in line for line in lines)


# --- on the real API server, through Kueue's webhooks -----------------------------------------


def test_rendered_objects_pass_the_servers_schema_and_kueues_webhooks(env):
    """Every case above, applied with nodeagent's own apply: the API server validates them
    against Kueue's CRD schema, Kueue's webhooks default and validate them, and what the
    server stores holds exactly the fields nodeagent wrote."""
    for index, case in enumerate(CASES):
        tier, settings, _reclaim, _groups = case.values
        team = f"c{index}-{env.uid}"
        data = one_team(tier, settings)
        data["teams"][0]["name"] = team
        data["teams"][0]["namespaces"] = [env.ns]
        data["tiers"] = {"training": {**(settings or {}), "cohort": env.name("training")}}
        objects = [o for o in render(quota_policy(data), env.api) if o["kind"] == "ClusterQueue"]
        objects[0]["spec"]["resourceGroups"] = [
            {**g, "flavors": [{**f, "name": env.name(f["name"])} for f in g["flavors"]]}
            for g in objects[0]["spec"]["resourceGroups"]
        ]
        report = apply_objects(env.kube, env.api, objects)
        assert report.ok, report.lines()
        assert report.applied == [f"ClusterQueue {team}-training"]
        stored = env.cluster_queue(f"{team}-training")["spec"]
        wanted = objects[0]["spec"]
        assert stored["cohortName"] == wanted["cohortName"]
        assert stored["namespaceSelector"] == wanted["namespaceSelector"]
        assert (
            stored["preemption"]["reclaimWithinCohort"]
            == wanted["preemption"]["reclaimWithinCohort"]
        )
        as_strings = [
            {
                **g,
                "flavors": [
                    {
                        **f,
                        "resources": [
                            {k: str(v) if k != "name" else v for k, v in r.items()}
                            for r in f["resources"]
                        ],
                    }
                    for f in g["flavors"]
                ],
            }
            for g in wanted["resourceGroups"]
        ]
        assert stored["resourceGroups"] == as_strings
        again = apply_objects(env.kube, env.api, objects)
        assert again.unchanged == [f"ClusterQueue {team}-training"], (
            "applying again changes nothing"
        )


def test_v1beta1_rendering_matches_the_servers_v1beta1_schema(env):
    """A strict server-side dry run validates against the CRD's v1beta1 schema: nodeagent's
    v1beta1 ClusterQueue passes, and v1beta2's field name is refused there.

    The harness installs Kueue's CRDs without their conversion webhook, so Kueue's own
    validating webhook reads a v1beta1 object as if it were v1beta2 (and would miss the
    cohort); the quota here has no borrowing or lending limit, which only that check needs.
    """
    policy = quota_policy(one_team(gpu({"guaranteed": 1, "borrow": "unlimited"})))
    (cq,) = [o for o in render(policy, kueue.KueueApi("v1beta1")) if o["kind"] == "ClusterQueue"]
    cq["metadata"]["name"] = env.name("v1beta1")
    text = yaml.safe_dump(cq)
    env.plane.kubectl(
        "apply", "--server-side", "--dry-run=server", "--validate=strict", "-f", "-", stdin=text
    )
    cq["spec"]["cohortName"] = cq["spec"].pop("cohort")
    with pytest.raises(Exception, match=r"cohortName: field not declared in schema"):
        env.plane.kubectl(
            "apply",
            "--server-side",
            "--dry-run=server",
            "--validate=strict",
            "-f",
            "-",
            stdin=yaml.safe_dump(cq),
        )


def test_tiers_that_would_share_a_flavor_name_are_one_line_errors(tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: v1\ntiers:\n  - name: Training\n  - name: training\n")
    result = CliRunner().invoke(
        app, ["run", "--policy", str(policy), "--server", "http://127.0.0.1:9", "--once"]
    )
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "error: tier training and tier Training would both be flavor training",
        "hint: rename the tiers, or set flavor_prefix in the quota policy",
    ]
