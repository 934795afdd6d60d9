"""Request templates: the GPU shapes a tier (or one team in it) allows, enforced where requests
enter, by the API server itself.

The pool review recommends request sizes that pack well (whole nodes, halves, quarters; MIG
profiles the layouts offer). A policy makes that a rule: ``tiers.<tier>.templates`` (or a
team's ``templates`` in that tier) lists the whole-GPU counts and MIG profiles a pod may ask
for, and :func:`admission_objects` turns each distinct rule into a
``ValidatingAdmissionPolicy`` and its binding (``admissionregistration.k8s.io/v1``, CEL run
by kube-apiserver: no webhook to deploy, nothing to go down). It checks what is submitted to
the tier's LocalQueues (the ``kueue.x-k8s.io/queue-name`` label, in the team's namespaces):
``batch/v1`` Jobs, Deployments and StatefulSets, the kinds of Kueue's JobSet, Ray (RayJob,
RayCluster), Kubeflow (PyTorchJob, TFJob, XGBoostJob, PaddleJob, JAXJob, MPIJob v2beta1) and
LeaderWorkerSet integrations, each by every pod template it holds, Kubeflow Trainer's TrainJob
by its trainer's ``resourcesPerNode`` (its pod templates are the training runtime's), and plain
pods (Kueue's pod integration), on create.

- ``type: hard``: a request of another shape is refused (``validationActions: [Deny]``);
- ``type: soft``: it is admitted with a warning the client prints (``kubectl`` shows it) and an
  audit annotation (``[Warn, Audit]``), so teams see the rule before it is made hard.

Every pod template is checked (a JobSet's replicated jobs, a Ray cluster's head and worker
groups, a Kubeflow job's replica types), and the message names the first shape that breaks the
rule: the shape asked, what the tier allows, and the nearest allowed shape: the
smallest allowed count at least as large (else the largest), the smallest allowed MIG profile
with at least as many compute slices (else the largest). Counts are per pod, over its
containers' limits (an extended resource always has a limit; a request must equal it), as the
scheduler and Kueue count a pod: the largest of what its containers and sidecars hold together
and what each init container holds with the sidecars started before it. MIG profiles are
checked in every container, init containers included.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from nodeagent import labels as lbl
from nodeagent_tiering.cluster import JSON, kueue
from nodeagent_tiering.quota.policy import (
    GPU,
    NAMESPACE_SELECTOR_KEY,
    QuotaPolicy,
    Templates,
    dns_name,
    local_queues,
    reserve_namespaces,
    reserved_local_queue,
)

MIG_PREFIX = "nvidia.com/mig-"
NAME_PREFIX = "nodeagent-templates-"


@dataclass
class _Rule:
    """One rule and where it applies: the LocalQueues (namespace, name) it checks."""

    name: str
    tier: str
    team: str | None  # a team's own templates; None: the tier's
    templates: Templates
    queues: set[tuple[str, str]] = field(default_factory=set)
    where: str = ""  # how messages name it; default "tier T" or "tier T (team X)"


def _rules(policy: QuotaPolicy) -> list[_Rule]:
    rules: dict[str, _Rule] = {}
    teams = {t.name: t for t in policy.teams}
    for key, namespace, queue in local_queues(policy):
        own = teams[key.team].tiers[key.tier].templates
        templates = own or policy.settings(key.tier).templates
        if templates is None:
            continue
        name = NAME_PREFIX + dns_name(key.tier) + (f"-{key.team}" if own else "")
        rule = rules.setdefault(name, _Rule(name, key.tier, key.team if own else None, templates))
        rule.queues.add((namespace, queue))
    for tier, settings in policy.tiers.items():
        reserve = settings.reserve
        namespaces = reserve_namespaces(policy, tier)
        if reserve is None or not namespaces:
            continue
        # The reserve's queue takes whole nodes only: a smaller job there would hold reserved
        # quota that is not reclaimed (it is the reserve's own, not lent).
        name = NAME_PREFIX + dns_name(tier) + "-reserved"
        queue = reserved_local_queue(policy, tier)
        rules[name] = _Rule(
            name,
            tier,
            None,
            Templates(type="hard", gpus=(reserve.gpus,)),
            {(ns, queue) for ns in namespaces},
            f"the reserve of tier {tier}",
        )
    return list(rules.values())


def _cel(value: object) -> str:
    """A CEL literal of a string, an int or a list of them (JSON's syntax is CEL's here)."""
    return json.dumps(value)


def _compute_slices(profile: str) -> int:
    match = re.match(r"^(\d+)g\.", profile)
    return int(match.group(1)) if match else 0


# The Kubeflow jobs Kueue integrates: kind -> the field that maps each replica type (Master,
# Worker, ...) to its spec and pod template.
KUBEFLOW = {
    "PyTorchJob": "pytorchReplicaSpecs",
    "TFJob": "tfReplicaSpecs",
    "XGBoostJob": "xgbReplicaSpecs",
    "PaddleJob": "paddleReplicaSpecs",
    "JAXJob": "jaxReplicaSpecs",
    "MPIJob": "mpiReplicaSpecs",
}

# What the rules check: (API group, version, resource), Kueue's integrations for them.
CHECKED = (
    ("", "v1", "pods"),
    ("batch", "v1", "jobs"),
    ("apps", "v1", "deployments"),
    ("apps", "v1", "statefulsets"),
    ("jobset.x-k8s.io", "v1alpha2", "jobsets"),
    ("ray.io", "v1", "rayjobs"),
    ("ray.io", "v1", "rayclusters"),
    *(("kubeflow.org", "v1", f"{kind.lower()}s") for kind in KUBEFLOW if kind != "MPIJob"),
    ("kubeflow.org", "v2beta1", "mpijobs"),  # the MPI operator's v2, as Kueue integrates it
    ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets"),
    ("trainer.kubeflow.org", "v1alpha1", "trainjobs"),
)


def _ray(cluster: str) -> str:
    """The pod specs of a Ray cluster spec: its head and each worker group."""
    return (
        f"[{cluster}.headGroupSpec.template.spec] + (has({cluster}.workerGroupSpecs) ? "
        f"{cluster}.workerGroupSpecs.map(w, w.template.spec) : [])"
    )


# The pod specs of what is submitted, by kind: each pod template it holds (a RayJob's submitter
# pod and an LWS's leader are optional), or the pod itself.
_LWS = "object.spec.leaderWorkerTemplate"
_TRAINER = "object.spec.trainer"
PODS = " : ".join(
    [
        "object.kind in ['Job', 'Deployment', 'StatefulSet'] ? [object.spec.template.spec]",
        "object.kind == 'JobSet' ? "
        "object.spec.replicatedJobs.map(r, r.template.spec.template.spec)",
        "object.kind == 'RayJob' ? (has(object.spec.rayClusterSpec) ? "
        f"{_ray('object.spec.rayClusterSpec')} : []) + "
        "(has(object.spec.submitterPodTemplate) ? [object.spec.submitterPodTemplate.spec] : [])",
        f"object.kind == 'RayCluster' ? {_ray('object.spec')}",
        *(
            f"object.kind == '{kind}' ? object.spec.{field}.map("
            f"k, object.spec.{field}[k].template.spec)"
            for kind, field in KUBEFLOW.items()
        ),
        f"object.kind == 'LeaderWorkerSet' ? [{_LWS}.workerTemplate.spec] + "
        f"(has({_LWS}.leaderTemplate) ? [{_LWS}.leaderTemplate.spec] : [])",
        # A TrainJob's trainer pods take their containers from the training runtime; the job
        # itself can only set the trainer container's resources, which is what is checked.
        f"object.kind == 'TrainJob' ? (has({_TRAINER}) && has({_TRAINER}.resourcesPerNode) ? "
        f"[{{'containers': [{{'resources': {_TRAINER}.resourcesPerNode}}]}}] : [])",
        "[object.spec]",
    ]
)


def _created(group: str, version: str, resource: str) -> JSON:
    return {
        "apiGroups": [group],
        "apiVersions": [version],
        "operations": ["CREATE"],
        "resources": [resource],
    }


def _policy(rule: _Rule) -> JSON:
    t = rule.templates
    where = rule.where or f"tier {rule.tier}" + (f" (team {rule.team})" if rule.team else "")
    submitted = [f"{ns}/{queue}" for ns, queue in sorted(rule.queues)]
    queue_of = (
        f"has(object.metadata.labels) && {_cel(lbl.KUEUE_QUEUE_NAME)} in object.metadata.labels"
        f" ? object.metadata.labels[{_cel(lbl.KUEUE_QUEUE_NAME)}] : ''"
    )
    limits = "has(c.resources) && has(c.resources.limits)"
    inits = "(has(p.initContainers) ? p.initContainers : [])"  # of pod spec p
    variables: list[JSON] = [{"name": "pods", "expression": PODS}]
    validations: list[JSON] = []
    if t.gpus:
        allowed = sorted(t.gpus)

        def count(c: str) -> str:
            """The whole GPUs container ``c`` asks for (its limit)."""
            return (
                f"(has({c}.resources) && has({c}.resources.limits) && {_cel(GPU)} in "
                f"{c}.resources.limits ? int(string({c}.resources.limits[{_cel(GPU)}])) : 0)"
            )

        def is_sidecar(c: str) -> str:
            return f"(has({c}.restartPolicy) && {c}.restartPolicy == 'Always')"

        # What pod spec p holds while it runs: its containers and its sidecars (init
        # containers that keep running) together.
        running = (
            f"(p.containers.map(c, {count('c')}).sum() + "
            f"{inits}.filter(c, {is_sidecar('c')}).map(c, {count('c')}).sum())"
        )
        # Each init container of p that runs to completion, with the sidecars started before
        # it (they keep running while it does).
        each_init = (
            f"{inits}.filter(c, !{is_sidecar('c')}).map(c, {count('c')} + "
            f"{inits}.filter(s, {is_sidecar('s')} && {inits}.indexOf(s) < {inits}.indexOf(c))"
            f".map(s, {count('s')}).sum())"
        )
        variables += [
            {
                # Each pod's request as the scheduler and Kueue count it: the largest of them
                # (CEL has no let: each part is written once so that it is evaluated once).
                "name": "podGpus",
                "expression": f"variables.pods.map(p, ([{running}] + {each_init}).max())",
            },
            {
                # The first pod's count the rule does not allow; 0 when every pod's is allowed.
                "name": "gpus",
                "expression": f"(variables.podGpus.filter(n, n != 0 && !(n in {_cel(allowed)}))"
                " + [0])[0]",
            },
        ]
        larger = f"{_cel(allowed)}.filter(n, n >= variables.gpus)"
        validations.append(
            {
                "expression": f"variables.gpus == 0 || variables.gpus in {_cel(allowed)}",
                "messageExpression": f"'{GPU}: ' + string(variables.gpus) + ' per pod is not "
                f"a shape {where} allows ({', '.join(map(str, allowed))}); the nearest allowed "
                f"is ' + string({larger}.size() > 0 ? {larger}.min() : {allowed[-1]})",
                "reason": "Forbidden",
            }
        )
    if t.mig:
        allowed_mig = sorted(t.mig, key=lambda p: (_compute_slices(p), p))
        resources = [MIG_PREFIX + p for p in allowed_mig]
        sizes = {MIG_PREFIX + p: _compute_slices(p) for p in allowed_mig}
        variables += [
            {
                # The first profile not allowed in each pod that asks for one.
                "name": "migAsked",
                "expression": f"variables.pods.map(p, (p.containers + {inits}).map(c, "
                f"{limits} ? c.resources.limits.filter("
                f"r, r.startsWith({_cel(MIG_PREFIX)}) && !(r in {_cel(resources)})) : [])"
                ".filter(l, l.size() > 0)).filter(l, l.size() > 0).map(l, l[0][0])",
            },
            {
                # The compute slices of the first profile asked that is not allowed ("3g...").
                "name": "migSlices",
                "expression": "variables.migAsked.size() == 0 ? 0 : "
                f"(variables.migAsked[0].substring({len(MIG_PREFIX)}).matches('^[0-9]+g[.]')"
                f" ? int(variables.migAsked[0].substring({len(MIG_PREFIX)}).split('g')[0])"
                " : 0)",
            },
        ]
        larger_mig = f"{_cel(resources)}.filter(r, {_cel(sizes)}[r] >= variables.migSlices)"
        validations.append(
            {
                "expression": "variables.migAsked.size() == 0",
                "messageExpression": "variables.migAsked[0] + ' is not a MIG profile "
                f"{where} allows ({', '.join(allowed_mig)}); the nearest allowed is ' + "
                f"({larger_mig}.size() > 0 ? {larger_mig}[0] : {_cel(resources[-1])})"
                f".substring({len(MIG_PREFIX)})",
                "reason": "Forbidden",
            }
        )
    return {
        "apiVersion": kueue.VALIDATING_POLICY.api_version,
        "kind": kueue.VALIDATING_POLICY.kind,
        "metadata": {"name": rule.name, "labels": _labels(rule)},
        "spec": {
            # A request the expressions cannot read is refused by a hard rule, let through by
            # a soft one: a soft rule never blocks work.
            "failurePolicy": "Fail" if t.type == "hard" else "Ignore",
            "matchConstraints": {"resourceRules": [_created(*checked) for checked in CHECKED]},
            "matchConditions": [
                {
                    "name": "submitted-to-the-tier",
                    "expression": f"request.namespace + '/' + ({queue_of}) in {_cel(submitted)}",
                }
            ],
            "variables": variables,
            "validations": validations,
        },
    }


def _labels(rule: _Rule) -> dict[str, str]:
    """nodeagent's labels on a rule's policy and binding: managed, tier, and team if any."""
    labels = {lbl.MANAGED_BY: lbl.MANAGED_BY_VALUE, lbl.TIER: rule.tier}
    if rule.team:
        labels[lbl.TEAM] = rule.team
    return labels


def _binding(rule: _Rule) -> JSON:
    namespaces = sorted({ns for ns, _ in rule.queues})
    return {
        "apiVersion": kueue.VALIDATING_BINDING.api_version,
        "kind": kueue.VALIDATING_BINDING.kind,
        "metadata": {"name": rule.name, "labels": _labels(rule)},
        "spec": {
            "policyName": rule.name,
            "validationActions": ["Deny"] if rule.templates.type == "hard" else ["Warn", "Audit"],
            "matchResources": {
                "namespaceSelector": {
                    "matchExpressions": [
                        {"key": NAMESPACE_SELECTOR_KEY, "operator": "In", "values": namespaces}
                    ]
                }
            },
        },
    }


def admission_objects(policy: QuotaPolicy) -> list[JSON]:
    """Every template rule's ValidatingAdmissionPolicy, then its binding."""
    rules = _rules(policy)
    return [_policy(r) for r in rules] + [_binding(r) for r in rules]
