"""One pass of the service over API-shaped objects, in process: ``nodeagent tiering simulate``.

With a tier policy the pass first plans tiers and drains exactly as the leader would
(:func:`nodeagent_tiering.drain.planner.plan`) and applies the node writes it would make
(tier labels, cordon, taint, drain record) to the objects; then it diagnoses every pending
GPU pod and every GPU Workload waiting in Kueue with no pod yet (its queue arithmetic from the
file's LocalQueues and ClusterQueues). Pods without a node are taken as the scheduler found
them: unschedulable (there is no scheduler here).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nodeagent import labels as lbl
from nodeagent_tiering.cluster import JSON
from nodeagent_tiering.cluster.nodes import DRAIN_ANNOTATION, DrainRecord, Node, Phase
from nodeagent_tiering.cluster.tier_policy import TierPolicy
from nodeagent_tiering.cluster.view import view_from_objects
from nodeagent_tiering.drain.planner import BreakerState, Release, SetTier, StartDrain, plan
from nodeagent_tiering.pending.diagnosis import Diagnoser
from nodeagent_tiering.pending.mig import MigPlanner
from nodeagent_tiering.pending.results import PassResult, settings_for


@dataclass(frozen=True, slots=True)
class Simulation:
    """What one pass would do, and why each pending GPU pod waits."""

    actions: tuple[str, ...]
    result: PassResult
    nodes: tuple[JSON, ...]  # the node objects after the service's writes

    def to_json(self) -> dict[str, Any]:
        """``{"actions": [...], "pending": [...]}``."""
        return {"actions": list(self.actions), **self.result.to_json()}


def _apply(
    nodes: Sequence[JSON], policy: TierPolicy, now_s: float
) -> tuple[tuple[str, ...], list[JSON]]:
    """Plan tiers and drains, and make the node writes the controller would make."""
    objects = [copy.deepcopy(dict(n)) for n in nodes]
    views = [Node.from_object(o) for o in objects]
    result = plan(views, policy, now_s, BreakerState(), {}, None)
    by_name = {v.name: o for v, o in zip(views, objects, strict=True)}
    lines = []
    for action in result.actions:
        obj = by_name[action.node]
        meta = obj["metadata"]
        labels = meta.setdefault("labels", {})
        if isinstance(action, SetTier):
            if action.tier is None:
                lines.append(f"remove the tier label of node {action.node} (it is in no tier)")
            else:
                lines.append(f"set tier {action.tier} on node {action.node}")
            if action.tier is None:
                labels.pop(lbl.TIER, None)
            else:
                labels[lbl.TIER] = action.tier
        elif isinstance(action, StartDrain):
            lines.append(
                f"cordon, taint and start draining node {action.node} "
                f"(tier {action.tier}: {action.cause})"
            )
            record = DrainRecord(Phase.DRAINING, action.tier, action.cause, now_s, now_s)
            labels[lbl.TIER] = policy.quarantine_tier
            meta.setdefault("annotations", {})[DRAIN_ANNOTATION] = record.to_json()
            spec = obj.setdefault("spec", {})
            spec["unschedulable"] = True
            taints = [t for t in spec.get("taints") or () if t.get("key") != policy.drain.taint_key]
            taints.append(
                {
                    "key": policy.drain.taint_key,
                    "value": "unstable",
                    "effect": policy.drain.taint_effect,
                }
            )
            spec["taints"] = taints
        elif isinstance(action, Release):
            lines.append(f"uncordon node {action.node} and return it to tier {action.tier}")
        else:
            lines.append(f"{type(action).__name__} on node {action.node}")
    return tuple(lines), objects


def simulate(
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    workloads: Sequence[Mapping[str, Any]] | None,
    policy: TierPolicy | None,
    planner: MigPlanner,
    *,
    now_s: float,
    local_queues: Sequence[Mapping[str, Any]] = (),
    cluster_queues: Sequence[Mapping[str, Any]] = (),
) -> Simulation:
    """One pass: the service's node writes (with a policy), then the diagnosis."""
    actions: tuple[str, ...] = ()
    objects = [dict(n) for n in nodes]
    if policy is not None:
        actions, objects = _apply(objects, policy, now_s)
    view = view_from_objects(
        objects, pods, workloads, local_queues=local_queues, cluster_queues=cluster_queues
    )
    result = Diagnoser(view, settings_for(policy, assume_unschedulable=True), planner).run()
    return Simulation(actions, result, tuple(objects))
