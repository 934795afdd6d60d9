"""Request templates: the GPU shapes a tier (or one team in it) allows, enforced where requests
enter, by the API server itself.

The pool review recommends request sizes that pack well (whole nodes, halves, quarters; MIG
profiles the layouts offer). A policy makes that a rule: ``tiers.<tier>.templates`` (or a
team's ``templates`` in that tier) lists the whole-GPU counts and MIG profiles a pod may ask
for, and :func:`admission_objects` turns each distinct rule into a
``ValidatingAdmissionPolicy`` and its binding (``admissionregistration.k8s.io/v1``, CEL run
by kube-apiserver: no webhook to deploy, nothing to go down). It checks what is submitted to
the tier's LocalQueues (the ``kueue.x-k8s.io/queue-name`` label, in the team's namespaces):
``batch/v1`` Jobs, by their pod template, and plain pods (Kueue's pod integration), on create.

- ``type: hard``: a request of another shape is refused (``validationActions: [Deny]``);
- ``type: soft``: it is admitted with a warning the client prints (``kubectl`` shows it) and an
  audit annotation (``[Warn, Audit]``), so teams see the rule before it is made hard.

The message names the shape asked, what the tier allows, and the nearest allowed shape: the
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


def _created(group: str, resource: str) -> JSON:
    return {
        "apiGroups": [group],
        "apiVersions": ["v1"],
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
    inits = "has({0}.initContainers) ? {0}.initContainers : []"
    variables: list[JSON] = [
        {
            "name": "containers",
            "expression": "object.kind == 'Job' ? object.spec.template.spec.containers"
            " : object.spec.containers",
        },
        {
            "name": "inits",
            "expression": f"object.kind == 'Job' ? ({inits.format('object.spec.template.spec')})"
            f" : ({inits.format('object.spec')})",
        },
    ]
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

        variables += [
            {
                # What the pod holds while it runs: its containers and its sidecars (init
                # containers that keep running) together.
                "name": "runningGpus",
                "expression": f"variables.containers.map(c, {count('c')}).sum() + "
                f"variables.inits.filter(c, {is_sidecar('c')}).map(c, {count('c')}).sum()",
            },
            {
                # Each init container that runs to completion, with the sidecars started
                # before it (they keep running while it does).
                "name": "initGpus",
                "expression": f"variables.inits.filter(c, !{is_sidecar('c')}).map(c, "
                f"{count('c')} + variables.inits.filter(s, {is_sidecar('s')} && "
                "variables.inits.indexOf(s) < variables.inits.indexOf(c))"
                f".map(s, {count('s')}).sum())",
            },
            {
                # The pod's request as the scheduler and Kueue count it: the largest of them.
                "name": "gpus",
                "expression": "variables.initGpus.size() > 0 && "
                "variables.initGpus.max() > variables.runningGpus ? variables.initGpus.max() "
                ": variables.runningGpus",
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
                "name": "migAsked",
                "expression": "(variables.containers + variables.inits).map(c, "
                f"{limits} ? c.resources.limits.filter("
                f"r, r.startsWith({_cel(MIG_PREFIX)}) && !(r in {_cel(resources)})) : [])"
                ".filter(l, l.size() > 0)",
            },
            {
                # The compute slices of the first profile asked that is not allowed ("3g...").
                "name": "migSlices",
                "expression": "variables.migAsked.size() == 0 ? 0 : "
                f"(variables.migAsked[0][0].substring({len(MIG_PREFIX)}).matches('^[0-9]+g[.]')"
                f" ? int(variables.migAsked[0][0].substring({len(MIG_PREFIX)}).split('g')[0])"
                " : 0)",
            },
        ]
        larger_mig = f"{_cel(resources)}.filter(r, {_cel(sizes)}[r] >= variables.migSlices)"
        validations.append(
            {
                "expression": "variables.migAsked.size() == 0",
                "messageExpression": "variables.migAsked[0][0] + ' is not a MIG profile "
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
            "matchConstraints": {
                "resourceRules": [
                    _created(group, resource)
                    for group, resource in (("", "pods"), ("batch", "jobs"))
                ]
            },
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
