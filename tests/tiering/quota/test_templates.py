"""Request templates on the real API server: a tier's allowed GPU shapes refuse (hard) or warn
about (soft) a Job, JobSet or pod submitted to it with another shape, naming the nearest allowed
one; what is not submitted to the tier is not checked."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
import yaml
from kubernetes import client

from nodeagent import labels as lbl
from nodeagent.testing.kube.nodes import pod_manifest
from nodeagent_tiering.quota.apply import apply_objects, policy_objects
from nodeagent_tiering.quota.policy import QuotaPolicyError
from nodeagent_tiering.quota.templates import CHECKED, KUBEFLOW
from tests.tiering.quota.conftest import KueueEnv, quota_policy, wait_for


def job(
    name: str,
    queue: str | None,
    resources: dict[str, str],
    inits: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A suspended Job (Kueue's usual path); ``inits``: its init containers."""
    spec = pod_manifest("main", resources=resources)["spec"]
    if inits:
        spec["initContainers"] = inits
    labels = {lbl.KUEUE_QUEUE_NAME: queue} if queue else {}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "suspend": True,
            "template": {"spec": {**spec, "restartPolicy": "Never"}},
        },
    }


def submitted(env: KueueEnv, namespace: str, obj: dict[str, Any]) -> str:
    """``kubectl create``: what it prints, warnings (stderr) included; "refused: ..." when the
    API server refused it."""
    done = subprocess.run(
        [str(env.plane.bin / "kubectl"), "--kubeconfig", str(env.plane.admin.path),
         "create", "-n", namespace, "-f", "-"],
        input=yaml.safe_dump(obj), capture_output=True, text=True, check=False,
    )  # fmt: skip
    out = done.stdout + done.stderr
    return out if done.returncode == 0 else f"refused: {out}"


def first_saying(
    env: KueueEnv, namespace: str, make: Callable[[str], dict[str, Any]], seen: str
) -> str:
    """Submit fresh copies until the output says ``seen``: the API server takes a new policy up
    a moment after it is written."""
    tries: list[str] = []

    def once() -> str | None:
        tries.append(submitted(env, namespace, make(f"try-{len(tries)}")))
        return tries[-1] if seen in tries[-1] else None

    found: str = wait_for(once, 60, f"{seen!r} from the API server (last: {tries[-1:]})")
    return found


def jobset(name: str, queue: str, pods: list[dict[str, str]]) -> dict[str, Any]:
    """A suspended JobSet (the real CRD) with one replicated job per entry: its pods' limits."""
    replicated = [
        {
            "name": f"r{i}",
            "replicas": 1,
            "template": {"spec": {"template": job(f"r{i}", None, resources)["spec"]["template"]}},
        }
        for i, resources in enumerate(pods)
    ]
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "labels": {lbl.KUEUE_QUEUE_NAME: queue}},
        "spec": {"suspend": True, "replicatedJobs": replicated},
    }


def test_hard_templates_refuse_soft_ones_warn_naming_the_nearest_shape(env: KueueEnv) -> None:
    train, shared = env.name("train"), env.name("shared")
    a, b = env.namespace("a"), env.namespace("b")
    gpu = {"nvidia.com/gpu": {"guaranteed": 8}}
    mig = {"nvidia.com/mig-1g.10gb": {"guaranteed": 7}}
    policy = quota_policy(
        {
            "version": "v1",
            "tiers": {train: {"templates": {"type": "hard", "gpus": [1, 2, 4, 8]}}},
            "teams": [
                {"name": env.name("a"), "namespaces": [a],
                 "tiers": {train: {"resources": gpu}}},
                {"name": env.name("b"), "namespaces": [b],
                 "tiers": {train: {"resources": gpu},
                           shared: {"resources": mig, "templates": {
                               "mig": ["3g.40gb", "1g.10gb"]}}}},
            ],
        }
    )  # fmt: skip
    report = apply_objects(env.kube, env.api, policy_objects(policy, env.api))
    assert report.ok, report.lines()
    assert f"ValidatingAdmissionPolicy nodeagent-templates-{train}: applied" in report.lines()
    assert (
        f"ValidatingAdmissionPolicyBinding nodeagent-templates-{shared}-{env.name('b')}: applied"
        in report.lines()
    )

    submit = partial(submitted, env)
    until = partial(first_saying, env)

    refused = until(a, lambda name: job(name, train, {"nvidia.com/gpu": "3"}), "refused")
    assert (
        f"nvidia.com/gpu: 3 per pod is not a shape tier {train} allows (1, 2, 4, 8); "
        "the nearest allowed is 4"
    ) in refused, refused
    assert "job.batch/four created" in submit(a, job("four", train, {"nvidia.com/gpu": "4"}))
    too_big = submit(a, job("sixteen", train, {"nvidia.com/gpu": "16"}))
    assert "the nearest allowed is 8" in too_big, too_big
    # An init container is part of the pod's shape as the scheduler counts it: the larger of
    # the init container and what runs after it.
    (main,) = pod_manifest("setup", resources={"nvidia.com/gpu": "3"})["spec"]["containers"]
    setup = [{**main, "name": "setup"}]
    init_three = submit(a, job("init-three", train, {}, inits=setup))
    assert "3 per pod is not a shape" in init_three, init_three
    assert "created" in submit(a, job("init-under", train, {"nvidia.com/gpu": "4"}, inits=setup))
    sidecar = [{**setup[0], "restartPolicy": "Always"}]  # runs beside the main container: 3 + 4
    beside = submit(a, job("sidecar", train, {"nvidia.com/gpu": "4"}, inits=sidecar))
    assert "7 per pod is not a shape" in beside, beside
    # An init container runs beside the sidecars started before it: 1 + 2, while 1 + 1 after.
    one = {**main, "name": "log", "restartPolicy": "Always",
           "resources": {"limits": {"nvidia.com/gpu": "1"}}}  # fmt: skip
    two = {**main, "name": "warm", "resources": {"limits": {"nvidia.com/gpu": "2"}}}
    ordered = submit(a, job("ordered", train, {"nvidia.com/gpu": "1"}, inits=[one, two]))
    assert "3 per pod is not a shape" in ordered, ordered
    after = submit(a, job("after", train, {"nvidia.com/gpu": "1"}, inits=[two, one]))
    assert "created" in after, after  # the init's 2 alone, then 1 + 1 running
    # Not submitted to the tier (no queue label): not the tier's rule to check.
    assert "job.batch/free created" in submit(a, job("free", None, {"nvidia.com/gpu": "3"}))
    # A plain pod (Kueue's pod integration) is checked as well.
    pod = pod_manifest("p3", gpus=3, labels={lbl.KUEUE_QUEUE_NAME: train})
    assert "refused" in submit(b, pod)

    # Team b's own soft rule in the shared tier: admitted, with the warning kubectl prints.
    asked = {"nvidia.com/mig-2g.20gb": "1"}
    warned = until(b, lambda name: job(name, shared, asked), "Warning")
    assert "created" in warned, warned
    assert (
        f"nvidia.com/mig-2g.20gb is not a MIG profile tier {shared} (team {env.name('b')}) "
        "allows (1g.10gb, 3g.40gb); the nearest allowed is 3g.40gb"
    ) in warned, warned
    fine, odd = {"nvidia.com/mig-1g.10gb": "1"}, {"nvidia.com/mig-4g.40gb": "1"}
    js_warned = submit(b, jobset("js-mig", shared, [fine, odd]))
    assert "created" in js_warned, js_warned
    assert (
        f"nvidia.com/mig-4g.40gb is not a MIG profile tier {shared} (team {env.name('b')}) "
        "allows (1g.10gb, 3g.40gb); the nearest allowed is 3g.40gb"  # none larger: the largest
    ) in js_warned, js_warned
    assert "Warning" not in submit(b, jobset("js-mig-ok", shared, [fine, fine]))
    ok = submit(b, job("m-ok", shared, {"nvidia.com/mig-1g.10gb": "1"}))
    assert "created" in ok, ok
    assert "Warning" not in ok, ok
    batch = client.BatchV1Api(env.api_client)
    assert batch.read_namespaced_job("m-ok", b).metadata.name == "m-ok"


@pytest.mark.parametrize(
    ("templates", "says"),
    [
        ({}, "a template names gpus (counts), mig (profiles) or both"),
        ({"gpus": [0]}, "0 is not a GPU count"),
        ({"gpus": [2, 2]}, "a count is listed twice"),
        ({"mig": ["3g40gb"]}, "'3g40gb' is not a MIG profile name such as 3g.40gb"),
        ({"type": "strict", "gpus": [1]}, "templates.type"),
    ],
)
def test_a_bad_template_is_one_line_naming_the_field(templates: dict[str, Any], says: str) -> None:
    data = {
        "version": "v1",
        "tiers": {"train": {"templates": templates}},
        "teams": [
            {"name": "a", "namespaces": ["a"],
             "tiers": {"train": {"resources": {"nvidia.com/gpu": {"guaranteed": 1}}}}},
        ],
    }  # fmt: skip
    with pytest.raises(QuotaPolicyError) as err:
        quota_policy(data)
    assert says in str(err.value), str(err.value)
    assert "tiers.train.templates" in str(err.value), str(err.value)


def ray_cluster(pods: list[dict[str, str]]) -> dict[str, Any]:
    """A Ray cluster spec: the head with the first limits, one worker group per other entry."""
    head, *workers = [pod_manifest("ray", resources=r)["spec"] for r in pods]
    return {
        "headGroupSpec": {"rayStartParams": {}, "template": {"spec": head}},
        "workerGroupSpecs": [
            {"groupName": f"g{i}", "replicas": 1, "minReplicas": 1, "maxReplicas": 1,
             "rayStartParams": {}, "template": {"spec": spec}}
            for i, spec in enumerate(workers)
        ],
    }  # fmt: skip


def integration(kind: str, name: str, queue: str, pods: list[dict[str, str]]) -> dict[str, Any]:
    """An object of one of Kueue's integrations (the real CRDs), suspended where the kind can
    be, holding one pod template per entry of ``pods`` (each pod's limits)."""
    specs = [pod_manifest("main", resources=r)["spec"] for r in pods]
    meta = {"name": name, "labels": {lbl.KUEUE_QUEUE_NAME: queue}}
    if kind == "JobSet":
        return jobset(name, queue, pods)
    if kind == "RayJob":
        body = {
            "suspend": True,
            "entrypoint": "python train.py",
            "rayClusterSpec": ray_cluster(pods),
        }
        return {"apiVersion": "ray.io/v1", "kind": kind, "metadata": meta, "spec": body}
    if kind == "RayCluster":
        body = {"suspend": True, **ray_cluster(pods)}
        return {"apiVersion": "ray.io/v1", "kind": kind, "metadata": meta, "spec": body}
    if kind == "TrainJob":  # its pod templates are the runtime's; it sets the trainer's resources
        (limits,) = pods
        trainer = {"numNodes": 2, "resourcesPerNode": {"limits": limits}}
        body = {"suspend": True, "runtimeRef": {"name": "torch-distributed"}, "trainer": trainer}
        return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": kind, "metadata": meta,
                "spec": body}  # fmt: skip
    if kind in ("Deployment", "StatefulSet"):  # no replicas: the test wants no pods
        (spec,) = specs
        app = {"app": name}
        body = {"replicas": 0, "selector": {"matchLabels": app},
                "template": {"metadata": {"labels": app}, "spec": spec}}  # fmt: skip
        return {"apiVersion": "apps/v1", "kind": kind, "metadata": meta, "spec": body}
    if kind in KUBEFLOW_ROLES:
        roles = dict(zip(KUBEFLOW_ROLES[kind], specs, strict=True))
        body = {
            "runPolicy": {"suspend": True},
            KUBEFLOW[kind]: {
                role: {"replicas": 1, "template": {"spec": {**spec, "restartPolicy": "Never"}}}
                for role, spec in roles.items()
            },
        }
        version = "kubeflow.org/v2beta1" if kind == "MPIJob" else "kubeflow.org/v1"
        return {"apiVersion": version, "kind": kind, "metadata": meta, "spec": body}
    assert kind == "LeaderWorkerSet"
    worker, *leader = specs  # the worker template first; a leader template if a second entry
    template: dict[str, Any] = {"size": 2, "workerTemplate": {"spec": worker}}
    if leader:
        template["leaderTemplate"] = {"spec": leader[0]}
    body = {"replicas": 1, "leaderWorkerTemplate": template}
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": kind, "metadata": meta,
            "spec": body}  # fmt: skip


# The replica types each Kubeflow job is given here, in order (JAXJob has only workers).
KUBEFLOW_ROLES = {
    "PyTorchJob": ("Master", "Worker"),
    "TFJob": ("Chief", "Worker"),
    "XGBoostJob": ("Master", "Worker"),
    "PaddleJob": ("Master", "Worker"),
    "JAXJob": ("Worker",),
    "MPIJob": ("Launcher", "Worker"),
}
# Each kind checked besides Job and Pod, and how many pod templates it is given.
KINDS = {
    "JobSet": 2,
    "RayJob": 2,
    "RayCluster": 2,
    **{kind: len(roles) for kind, roles in KUBEFLOW_ROLES.items()},
    "LeaderWorkerSet": 2,
    "Deployment": 1,
    "StatefulSet": 1,
    "TrainJob": 1,
}


def test_every_pod_template_of_kueues_integrations_is_checked(env: KueueEnv) -> None:
    train = env.name("train")
    a = env.namespace("a")
    policy = quota_policy(
        {
            "version": "v1",
            "tiers": {train: {"templates": {"type": "hard", "gpus": [1, 2, 4, 8]}}},
            "teams": [{"name": env.name("a"), "namespaces": [a],
                       "tiers": {train: {"resources": {"nvidia.com/gpu": {"guaranteed": 8}}}}}],
        }
    )  # fmt: skip
    assert apply_objects(env.kube, env.api, policy_objects(policy, env.api)).ok
    four, three, eight = ({"nvidia.com/gpu": n} for n in ("4", "3", "8"))
    first_saying(env, a, lambda name: integration("JobSet", name, train, [three]), "refused")
    checked = {resource for _group, _version, resource in CHECKED}
    assert {f"{kind.lower()}s" for kind in KINDS} | {"pods", "jobs"} == checked
    for kind, templates in KINDS.items():
        # The shape that breaks the rule is in the last pod template (a worker group, the
        # worker replicas, the LWS leader), so every template is read, not only the first.
        bad = [four] * (templates - 1) + [three]
        refused = submitted(env, a, integration(kind, "bad", train, bad))
        assert "refused" in refused, f"{kind}: {refused}"
        assert (
            f"nvidia.com/gpu: 3 per pod is not a shape tier {train} allows (1, 2, 4, 8); "
            "the nearest allowed is 4"
        ) in refused, f"{kind}: {refused}"
        good = [eight] * (templates - 1) + [four]
        admitted = submitted(env, a, integration(kind, f"fits-{kind.lower()}", train, good))
        assert "created" in admitted, f"{kind}: {admitted}"
    # A TrainJob that leaves the trainer's resources to its runtime has nothing to check here.
    runtime_decides = integration("TrainJob", "runtime-decides", train, [eight])
    del runtime_decides["spec"]["trainer"]
    assert "created" in submitted(env, a, runtime_decides)
