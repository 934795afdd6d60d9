"""The shipped manifests on the test control plane, and the components' own identities.

The deploy manifests are rendered with the pinned kubectl's kustomize (what an operator's
``kubectl apply -k`` does) and their ServiceAccounts, (Cluster)Roles and bindings applied as
they are. Each component then talks to the API server with a token of its own ServiceAccount
(:meth:`ControlPlane.service_account_kubeconfig`), so a verb missing from a manifest's Role is a
``403`` in the test that needs it, not a surprise in a user's cluster.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from nodeagent.testing.kube.controlplane import ControlPlane, ControlPlaneError, Kubeconfig

JSON = dict[str, Any]
REPO = Path(__file__).resolve().parents[3]
KUSTOMIZE_DIR = REPO / "deploy" / "kubernetes"
AGENT_MANIFESTS = KUSTOMIZE_DIR / "overlays" / "plugin-exporter"
TIERING_MANIFESTS = KUSTOMIZE_DIR / "tiering"
RBAC_KINDS = frozenset(
    {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
)
BINDING_KINDS = frozenset({"ClusterRoleBinding", "RoleBinding"})


def render(plane: ControlPlane, directory: Path) -> list[JSON]:
    """The objects a kustomization renders to (``kubectl kustomize``), in output order."""
    text = plane.kubectl("kustomize", str(directory))
    return [doc for doc in yaml.safe_load_all(text) if doc]


def kubectl_apply(plane: ControlPlane, objects: list[JSON], *, dry_run: bool = False) -> list[JSON]:
    """``kubectl apply`` of ``objects`` as an operator runs it (client-side, as the admin);
    ``dry_run`` is ``--dry-run=server`` (admission and validation, nothing stored). Returns the
    objects as the API server answered them (defaults filled in); ControlPlaneError carries
    its refusal."""
    extra = ["--dry-run=server"] if dry_run else []
    text = plane.kubectl(
        "apply", *extra, "-o", "json", "-f", "-", stdin=yaml.safe_dump_all(objects)
    )
    answer = json.loads(text)
    items: list[JSON] = answer.get("items", [answer]) if answer.get("kind") == "List" else [answer]
    return items


def kubectl_delete(plane: ControlPlane, objects: list[JSON]) -> None:
    """Delete ``objects`` and wait until they and what they own are gone (a workload's pods
    too: foreground cascading), so later tests on the same control plane never meet them."""
    if objects:
        plane.kubectl(
            "delete",
            "--cascade=foreground",
            "--wait=true",
            "--timeout=60s",
            "--ignore-not-found",
            "-f",
            "-",
            stdin=yaml.safe_dump_all(objects),
        )


def rbac_objects(objects: list[JSON]) -> list[JSON]:
    """The namespaces, ServiceAccounts, roles and bindings among rendered objects."""
    return [o for o in objects if o["kind"] in RBAC_KINDS]


def service_account(objects: list[JSON]) -> tuple[str, str]:
    """(namespace, name) of the one ServiceAccount a component's manifests hold."""
    (account,) = [o["metadata"] for o in objects if o["kind"] == "ServiceAccount"]
    return account["namespace"], account["name"]


def user_of(namespace: str, name: str) -> str:
    """The user name the API server (and its audit log) gives a ServiceAccount's token."""
    return f"system:serviceaccount:{namespace}:{name}"


@dataclass(frozen=True)
class Identity:
    """A component's ServiceAccount, bound by the shipped manifests, as a kubeconfig."""

    namespace: str
    name: str
    kubeconfig: Kubeconfig

    @property
    def user(self) -> str:
        """The user name in the audit log."""
        return user_of(self.namespace, self.name)


@dataclass(frozen=True)
class Identities:
    """The agent's and the tiering service's identities."""

    agent: Identity
    tiering: Identity
    tiering_manifests: tuple[JSON, ...]

    def tiering_replica(self, plane: ControlPlane, name: str) -> Identity:
        """Another ServiceAccount with exactly the tiering service's roles: each binding of the
        manifests copied for it, the roles themselves untouched. Two replicas of the service
        then show apart in the audit log (the Deployment's replicas share one account)."""
        namespace = self.tiering.namespace
        copies = []
        for obj in self.tiering_manifests:
            if obj["kind"] not in BINDING_KINDS:
                continue
            binding = copy.deepcopy(obj)
            binding["metadata"]["name"] = f"{obj['metadata']['name']}-{name}"
            binding["subjects"] = [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]
            copies.append(binding)
        kubeconfig = plane.service_account_kubeconfig(namespace, name)
        plane.apply(copies)
        wait_bound(plane, user_of(namespace, name), self.tiering_manifests)
        return Identity(namespace, name, kubeconfig)


def install_identities(plane: ControlPlane) -> Identities:
    """Apply the agent's and the tiering service's RBAC objects from the deploy manifests and
    return a kubeconfig for each ServiceAccount."""
    agent_objects = render(plane, AGENT_MANIFESTS)
    tiering_objects = render(plane, TIERING_MANIFESTS)
    plane.apply(rbac_objects(agent_objects) + rbac_objects(tiering_objects))
    agent_ns, agent_name = service_account(agent_objects)
    tiering_ns, tiering_name = service_account(tiering_objects)
    wait_bound(plane, user_of(agent_ns, agent_name), rbac_objects(agent_objects))
    wait_bound(plane, user_of(tiering_ns, tiering_name), rbac_objects(tiering_objects))
    return Identities(
        agent=Identity(
            agent_ns, agent_name, plane.service_account_kubeconfig(agent_ns, agent_name)
        ),
        tiering=Identity(
            tiering_ns, tiering_name, plane.service_account_kubeconfig(tiering_ns, tiering_name)
        ),
        tiering_manifests=tuple(rbac_objects(tiering_objects)),
    )


def wait_bound(
    plane: ControlPlane, user: str, objects: tuple[JSON, ...] | list[JSON], timeout_s: float = 10.0
) -> None:
    """Wait until the API server's authorizer grants ``user`` every rule of the roles among
    ``objects`` (RBAC reaches the authorizer through an informer, a moment after the write)."""
    checks = []
    for role in objects:
        if role["kind"] not in ("ClusterRole", "Role"):
            continue
        namespace = role["metadata"].get("namespace", "")
        for rule in role.get("rules", []):
            for group in rule.get("apiGroups", [""]):
                for resource in rule.get("resources", []):
                    resource, _, subresource = resource.partition("/")
                    # A rule limited to some names grants nothing without one.
                    for name in rule.get("resourceNames") or [""]:
                        for verb in rule.get("verbs", []):
                            checks.append(
                                {
                                    "group": group,
                                    "resource": resource,
                                    "subresource": subresource,
                                    "verb": verb,
                                    "namespace": namespace,
                                    "name": name,
                                }
                            )
    deadline = time.monotonic() + timeout_s
    for attributes in checks:
        while not _allowed(plane, user, attributes):
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"RBAC never granted {user} {attributes}")
            time.sleep(0.05)


def _allowed(plane: ControlPlane, user: str, attributes: JSON) -> bool:
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{user.split(':')[2]}"],
            "resourceAttributes": attributes,
        },
    }
    answer = plane.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
    return bool(answer.get("status", {}).get("allowed"))
