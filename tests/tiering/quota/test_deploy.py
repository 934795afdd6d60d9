"""deploy/kubernetes/tiering-kueue: the tiering service with Kueue. The manifests go to the real
control plane; the service, the review and the quota apply each run under a ServiceAccount
bound only to its role, so a verb missing from a role fails here, and every verb a role grants
is one that identity used."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from nodeagent import labels as lbl
from nodeagent.agent.mig_planning import plan_for_diagnosis
from nodeagent.cli.tiering import app
from nodeagent_tiering import service as tiering
from nodeagent_tiering.cluster.tier_policy import parse_policy
from nodeagent_tiering.quota.policy import parse_quota_policy
from tests.tiering.quota.conftest import KueueEnv

REPO = Path(__file__).resolve().parents[3]
OVERLAY = REPO / "deploy" / "kubernetes" / "tiering-kueue"
EXAMPLE = REPO / "docs" / "examples" / "quota-policy.yaml"
NAMESPACE = "nodeagent"


def rendered(env: KueueEnv) -> list[dict[str, Any]]:
    """``kubectl kustomize`` with the control plane's own (pinned) kubectl."""
    return [d for d in yaml.safe_load_all(env.plane.kubectl("kustomize", str(OVERLAY))) if d]


def by_kind(objects, kind):
    return [o for o in objects if o["kind"] == kind]


def moved(env: KueueEnv, objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The objects in this test's namespace, cluster-scoped names made the test's own."""
    out = []
    for obj in copy.deepcopy(objects):
        meta = obj["metadata"]
        if meta.get("namespace") == NAMESPACE:
            meta["namespace"] = env.ns
        if obj["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            meta["name"] = env.name(meta["name"])
        if obj["kind"] == "ClusterRoleBinding":
            obj["roleRef"]["name"] = env.name(obj["roleRef"]["name"])
        for subject in obj.get("subjects") or ():
            if subject.get("namespace") == NAMESPACE:
                subject["namespace"] = env.ns
        out.append(obj)
    return out


def bind(env: KueueEnv, role: str, account: str) -> Any:
    """A ServiceAccount bound to nothing but the (moved) ClusterRole ``role``."""
    env.plane.apply(
        [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": env.name(f"{role}-{account}")},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": env.name(role),
                },
                "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": env.ns}],
            }
        ]
    )
    return env.plane.service_account_kubeconfig(env.ns, account)


def used(env: KueueEnv, mark: int, account: str) -> set[tuple[str, str]]:
    """(verb, resource) of the account's requests since ``mark``; none may be refused."""
    seen = env.plane.audited(mark, user=f"system:serviceaccount:{env.ns}:{account}")
    refused = [r for r in seen if r.code == 403]
    assert not refused, refused
    return {(r.verb, r.resource) for r in seen if r.resource}


def applied(calls: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """Server-side apply of a new object is authorized as create as well as patch (without
    create it is refused); the audit log names the request's verb, patch, only."""
    return calls | {("create", resource) for verb, resource in calls if verb == "patch"}


def granted(objects, role: str) -> set[tuple[str, str]]:
    (obj,) = [o for o in by_kind(objects, "ClusterRole") if o["metadata"]["name"] == role]
    return {(v, r) for rule in obj["rules"] for r in rule["resources"] for v in rule["verbs"]}


def test_the_overlay_adds_the_quota_policy_and_the_kueue_roles(env):
    objects = rendered(env)
    (deployment,) = by_kind(objects, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "--quota=/etc/nodeagent-tiering-quota/quota.yaml" in container["args"]
    result = CliRunner().invoke(app, [*container["args"][1:], "--help"])
    assert result.exit_code == 0, result.output
    config = next(
        o
        for o in by_kind(objects, "ConfigMap")
        if o["metadata"]["name"].startswith("nodeagent-tiering-quota")
    )
    assert config["data"]["quota.yaml"] == EXAMPLE.read_text(), "the shipped policy is the example"
    tiers = next(o for o in by_kind(objects, "ConfigMap") if "policy.yaml" in o["data"])
    policy = parse_policy(yaml.safe_load(tiers["data"]["policy.yaml"]))
    parse_quota_policy(config["data"]["quota.yaml"], tiers=[t.name for t in policy.tiers])
    # Everything passes the API server's validation (schema, admission) as it would install.
    text = yaml.safe_dump_all(moved(env, objects))
    env.plane.kubectl("apply", "--server-side", "--dry-run=server", "-f", "-", stdin=text)


def test_each_identity_works_under_exactly_its_role(env, tmp_path):
    objects = moved(env, rendered(env))
    roles = [
        o
        for o in objects
        if o["kind"]
        in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount")
    ]
    env.plane.apply(roles)
    original = rendered(env)

    # The service: flavors created, updated and deleted, queues read.
    mark = env.plane.audit_mark()
    kubeconfig = env.plane.service_account_kubeconfig(env.ns, "nodeagent-tiering")
    stale = {
        "apiVersion": env.api.api_version,
        "kind": "ResourceFlavor",
        "metadata": {"name": env.name("gone"), "labels": {lbl.MANAGED_BY: lbl.MANAGED_BY_VALUE}},
        "spec": {},
    }
    env.plane.apply([stale])
    policy = {
        "version": "v1",
        "tiers": [{"name": env.name("train")}],
        "nodes": {"match_labels": {lbl.POOL: env.uid}},
    }
    service = tiering.build(
        env.plane.api_client(kubeconfig),
        parse_policy(policy),
        namespace=env.ns,
        lease_name="nodeagent-tiering",
        identity="replica-1",
        dry_run=False,
        planner=plan_for_diagnosis,
    )
    tiering.run_once(service)
    report = service.kueue.last_report
    assert env.name("train") in report.created
    assert env.name("gone") in report.deleted
    env.edit("resourceflavors", env.name("train"), ["spec", "nodeLabels", lbl.TIER], "old")
    tiering.run_once(service)  # conflicts now: reported, not forced
    assert env.name("train") in service.kueue.last_report.drifted
    kueue_calls = {
        c
        for c in used(env, mark, "nodeagent-tiering")
        if c[1] in ("resourceflavors", "clusterqueues")
    }
    # A pass lists; the diagnosis's informers watch the queues (tests/tiering/pending).
    kueue_rules = {
        (verb, resource)
        for verb, resource in granted(original, "nodeagent-tiering")
        if resource in ("resourceflavors", "clusterqueues") and verb != "watch"
    }
    assert applied(kueue_calls) == kueue_rules

    # Whoever applies the quota: queues and flavors, and --prune.
    quota = tmp_path / "quota.yaml"
    team, ns = env.name("t"), env.namespace("t")
    data = {
        "version": "v1",
        "teams": [
            {
                "name": team,
                "namespaces": [ns],
                "tiers": {env.name("gen"): {"resources": {"nvidia.com/gpu": {"guaranteed": 1}}}},
            }
        ],
        # Request templates: an admission policy and its binding, pruned with the tier below.
        "tiers": {env.name("gen"): {"templates": {"gpus": [1, 2]}}},
    }
    quota.write_text(yaml.safe_dump(data))
    admin = bind(env, "nodeagent-tiering-quota-admin", "quota-admin")
    mark = env.plane.audit_mark()
    args = ["quota", "render", "-f", str(quota), "--kubeconfig", str(admin.path), "--apply"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data["teams"][0]["tiers"] = {env.name("gen2"): data["teams"][0]["tiers"][env.name("gen")]}
    quota.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(app, [*args, "--prune"])
    assert result.exit_code == 0, result.output
    assert f"ClusterQueue {team}-{env.name('gen')}: pruned" in result.stdout
    assert f"ValidatingAdmissionPolicy nodeagent-templates-{env.name('gen')}: pruned" in (
        result.stdout
    ), result.stdout.splitlines()
    assert applied(used(env, mark, "quota-admin")) == granted(
        original, "nodeagent-tiering-quota-admin"
    )

    # The review and the check: read-only.
    reviewer = bind(env, "nodeagent-tiering-review", "reviewer")
    mark = env.plane.audit_mark()
    result = CliRunner().invoke(app, ["report", "--kubeconfig", str(reviewer.path), "--json"])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(
        app, ["quota", "check", "-f", str(quota), "--kubeconfig", str(reviewer.path)]
    )
    assert result.exit_code == 1, result.output  # no nodes back the quota: problems, no 403
    assert used(env, mark, "reviewer") == granted(original, "nodeagent-tiering-review")
