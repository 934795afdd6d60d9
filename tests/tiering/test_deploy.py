"""The tiering manifests: schema-valid, least-privilege RBAC, and args the CLI accepts."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from nodeagent.cli.tiering import app
from nodeagent_tiering.policy import parse_policy
from tests.deploy.tools import KUSTOMIZE_DIR, kustomize, require_module

DIRECTORY = KUSTOMIZE_DIR / "tiering"


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return kustomize(DIRECTORY)


def one(objects, kind):
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def test_every_object_is_schema_valid(objects):
    require_module("kubernetes_validate")
    import kubernetes_validate

    for obj in objects:
        kubernetes_validate.validate(obj, "1.35.0", strict=True)


def test_rbac_is_exactly_what_the_service_calls(objects):
    def rules(kind):
        return {
            (g, r, v)
            for rule in one(objects, kind)["rules"]
            for g in rule["apiGroups"]
            for r in rule["resources"]
            for v in rule["verbs"]
        }

    assert rules("ClusterRole") == {
        ("", "nodes", "get"), ("", "nodes", "list"), ("", "nodes", "watch"),
        ("", "nodes", "patch"), ("", "pods", "list"), ("", "pods/eviction", "create"),
    }  # fmt: skip
    assert rules("Role") == {
        ("coordination.k8s.io", "leases", "get"),
        ("coordination.k8s.io", "leases", "create"),
        ("coordination.k8s.io", "leases", "update"),
        ("", "events", "create"),
        ("", "events", "patch"),
    }
    account = one(objects, "ServiceAccount")["metadata"]
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        (subject,) = one(objects, kind)["subjects"]
        assert (subject["name"], subject["namespace"]) == (account["name"], account["namespace"])


def test_deployment_runs_two_electing_replicas_with_the_shipped_policy(objects):
    deployment = one(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == one(objects, "ServiceAccount")["metadata"]["name"]
    (container,) = pod["containers"]
    args = container["args"]
    assert args[:2] == ["tiering", "run"]
    assert "--in-cluster" in args
    policy_text = one(objects, "ConfigMap")["data"]["policy.yaml"]
    policy = parse_policy(yaml.safe_load(policy_text))
    assert [t.name for t in policy.tiers] == ["training", "general", "shared"]
    # The CLI accepts every flag the manifest passes (checked with --help after them).
    result = CliRunner().invoke(app, [*args[1:], "--help"])
    assert result.exit_code == 0, result.output
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
