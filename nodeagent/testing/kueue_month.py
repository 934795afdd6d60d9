"""A simulated month of a Kueue-run GPU pool, as the API server would hold it, with the truth.

:func:`simulate` makes, from a seed: GPU nodes in tiers (some unstable, some drained by the
tiering service), nodeagent's ResourceFlavors, one ClusterQueue per team and tier in the tier's
cohort, the teams' LocalQueues, Workloads with their conditions and admissions (some waiting
still, some requeued after a preemption), the pods that ran them (ended as they ended: done,
failed on their own, failed on a GPU fault, evicted by a drain), and the tiering service's
drain Events. Next to the objects it returns the truth each was made from (:class:`Run`), in
whole minutes, so a test can compute what the review must say without reading the objects.

It does not play Kueue: admissions are drawn, not decided, and may exceed what Kueue would
allow; the review reads what happened, whatever it was.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from nodeagent import labels as lbl

JSON = dict[str, Any]
MINUTE = 60
GPU = "nvidia.com/gpu"
GROUP = "kueue.x-k8s.io/v1beta2"

# How runs end (weights) and what a failure looks like.
ENDINGS = (("done", 80), ("application", 8), ("gpu-fault", 5), ("drain", 5), ("running", 2))
SIZES = ((1, 30), (2, 25), (4, 20), (8, 15), (3, 10))  # GPUs per pod, weights


def stamp(epoch_s: float) -> str:
    """A Kubernetes Time (seconds, UTC)."""
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Run:
    """The truth of one workload."""

    namespace: str
    name: str
    team: str
    tier: str
    queue: str  # ClusterQueue
    pods: int
    per_pod: int  # GPUs per pod
    created_s: float
    queued_s: float  # when it last entered the queue (creation, or its requeue)
    admitted_s: float | None  # None: still waiting
    finished_s: float | None  # None: still running (or waiting)
    ending: str  # done | application | gpu-fault | drain | running | pending
    node: str = ""
    cause: str = ""  # the drain's cause for gpu-fault / drain
    preempted: str = ""  # Preempted condition reason, when it was preempted before

    @property
    def gpus(self) -> int:
        """GPUs it holds while admitted."""
        return self.pods * self.per_pod

    @property
    def wait_s(self) -> float | None:
        """Queue wait, as Kueue measures it."""
        return None if self.admitted_s is None else self.admitted_s - self.queued_s


@dataclass
class Queue:
    """The truth of one ClusterQueue."""

    name: str
    team: str
    tier: str
    nominal: int
    borrowing_limit: int | None
    lending_limit: int | None


@dataclass
class Month:
    """The objects and the truth."""

    now_s: float
    period_s: float
    nodes: list[JSON] = field(default_factory=list)
    flavors: list[JSON] = field(default_factory=list)
    cluster_queues: list[JSON] = field(default_factory=list)
    local_queues: list[JSON] = field(default_factory=list)
    workloads: list[JSON] = field(default_factory=list)
    pods: list[JSON] = field(default_factory=list)
    events: list[JSON] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    queues: dict[str, Queue] = field(default_factory=dict)
    drains: dict[str, tuple[float, str]] = field(default_factory=dict)  # node -> (start, cause)
    node_tier: dict[str, str] = field(default_factory=dict)
    unstable: str = ""  # the node the agents flag unstable now (not drained yet)


def _weighted(rng: random.Random, table: tuple[tuple[Any, int], ...]) -> Any:
    return rng.choices([v for v, _ in table], weights=[w for _, w in table])[0]


def simulate(
    *,
    seed: int = 7,
    tiers: tuple[str, ...] = ("training", "general", "shared"),
    teams: int = 6,
    nodes_per_tier: int = 4,
    gpus_per_node: int = 8,
    workloads: int = 2000,
    days: float = 30.0,
    sizes: tuple[tuple[int, int], ...] = SIZES,
    now_s: float = 1_767_225_600.0,  # a whole minute
) -> Month:
    """One month (see the module doc). Every time is a whole minute."""
    rng = random.Random(seed)  # noqa: S311 - a seeded simulation, not a secret
    period = days * 86400
    month = Month(now_s=now_s, period_s=period)
    start = now_s - period
    for tier in tiers:
        month.flavors.append(
            {
                "apiVersion": GROUP,
                "kind": "ResourceFlavor",
                "metadata": {
                    "name": tier,
                    "labels": {lbl.MANAGED_BY: lbl.MANAGED_BY_VALUE, lbl.TIER: tier},
                },
                "spec": {"nodeLabels": {lbl.TIER: tier}},
            }
        )
        for i in range(nodes_per_tier):
            name = f"{tier}-node-{i}"
            month.node_tier[name] = tier
            month.nodes.append(_node(name, tier, gpus_per_node))
    # A few nodes were drained by the tiering service during the month (every tier keeps at
    # least one that was not, where application failures land, so that none of them looks
    # like a GPU fault).
    drained_nodes = []
    for tier in tiers:
        names = [n for n, t in month.node_tier.items() if t == tier]
        drained_nodes += rng.sample(names, k=min(len(names) - 1, max(1, len(names) // 3)))
    for name in drained_nodes:
        when = start + rng.randrange(int(period // MINUTE // 2), int(period // MINUTE)) * MINUTE
        cause = rng.choice(("Xid79", "Xid48", "Xid94", "RowRemapFailure"))
        month.drains[name] = (when, cause)
        tier = month.node_tier[name]
        month.events.append(
            _event(
                name,
                "DrainStarted",
                f"cordoned and draining (tier {tier}): GPUHealthy=False ({cause}): fault on GPU 2",
                when,
            )
        )
        month.events.append(
            _event(name, "DrainSucceeded", "drained: 3 pods evicted, 0 PDB refusals", when + 300)
        )
    for t in range(teams):
        team = f"team-{t}"
        ns = team
        for tier in tiers:
            if rng.random() < 0.2 and tier != tiers[0]:
                continue  # not every team has quota in every tier
            nominal = rng.choice((0, 4, 4, 8))
            borrow = rng.choice((0, 4, 8, None))
            lend = rng.choice((None, None, 0, 4))
            if lend is not None and lend > nominal:
                lend = nominal
            queue = Queue(f"{team}-{tier}", team, tier, nominal, borrow, lend)
            month.queues[queue.name] = queue
            month.cluster_queues.append(_cluster_queue(queue, ns))
            month.local_queues.append(
                {
                    "apiVersion": GROUP,
                    "kind": "LocalQueue",
                    "metadata": {"name": tier, "namespace": ns, "labels": _labels(team, tier)},
                    "spec": {"clusterQueue": queue.name},
                }
            )
    # One node of the first tier is unstable now: its GPUs back no quota.
    month.unstable = f"{tiers[0]}-node-0"
    flagged = next(n for n in month.nodes if n["metadata"]["name"] == month.unstable)
    flagged["metadata"]["labels"][lbl.STABILITY] = "unstable"
    flagged["status"]["conditions"].append(
        {"type": lbl.GPU_HEALTHY_CONDITION, "status": "False", "reason": "Xid79", "message": ""}
    )
    by_tier: dict[str, list[str]] = {}
    for name, tier in month.node_tier.items():
        by_tier.setdefault(tier, []).append(name)
    undrained = {t: [n for n in ns if n not in month.drains] or ns for t, ns in by_tier.items()}
    drained_in = {t: [n for n in ns if n in month.drains] for t, ns in by_tier.items()}
    queue_names = list(month.queues)
    # Some teams are busy, some mostly idle (their guarantee is lent, or wasted).
    activity = [rng.choice((0.1, 1.0, 1.0, 3.0)) for _ in queue_names]
    minutes = int(period // MINUTE)
    for i in range(workloads):
        queue = month.queues[rng.choices(queue_names, weights=activity)[0]]
        per_pod = _weighted(rng, sizes)
        pods = 1 if per_pod >= 4 else rng.choice((1, 1, 2))
        created = start + rng.randrange(-600, minutes - 10) * MINUTE  # some began last month
        wait = rng.choice((0, 0, 1, 2, 5, 10, 30)) * MINUTE
        if rng.random() < 0.05:
            wait = rng.randrange(60, 600) * MINUTE  # a long wait now and then
        if rng.random() < 0.02:
            created = now_s - rng.randrange(1, 120) * MINUTE  # still waiting now
            wait = 1000 * MINUTE
        runtime = rng.randrange(5, 8 * 60) * MINUTE
        ending = _weighted(rng, ENDINGS)
        queued, preempted = created, ""
        if rng.random() < 0.04:
            # Preempted and requeued: Kueue keeps only the last admission.
            queued = created + rng.randrange(1, 60) * MINUTE
            preempted = rng.choice(("InCohortReclamation", "InClusterQueue"))
        admit, finish = queued + wait, queued + wait + runtime
        if admit >= now_s:
            ending = "pending"
        elif ending == "running" or finish > now_s:
            ending = "running"
        healthy = undrained[queue.tier]
        node = rng.choice(healthy)
        cause = ""
        if ending in ("gpu-fault", "drain"):
            drained = drained_in[queue.tier]
            if not drained:
                ending = "application"
            else:
                node = rng.choice(drained)
                when, cause = month.drains[node]
                if ending == "drain":
                    finish = when + MINUTE  # evicted a minute into the drain
                else:
                    finish = when - rng.randrange(1, 50) * MINUTE  # died, then the node drained
                if finish <= admit:
                    admit = finish - MINUTE
                    if admit < queued:  # it could not have run before the drain
                        ending, cause, node = "application", "", rng.choice(healthy)
                        admit = queued + wait
                        finish = min(admit + runtime, now_s - MINUTE)
        admitted = None if ending == "pending" else admit
        finished = None if ending in ("pending", "running") else finish
        run = Run(
            namespace=queue.team,
            name=f"job-{i}",
            team=queue.team,
            tier=queue.tier,
            queue=queue.name,
            pods=pods,
            per_pod=per_pod,
            created_s=created,
            queued_s=queued,
            admitted_s=admitted,
            finished_s=finished,
            ending=ending,
            node=node if admitted is not None else "",
            cause=cause,
            preempted=preempted,
        )
        month.runs.append(run)
        month.workloads.append(_workload(run))
        month.pods.extend(_pods(run))
    _status(month)
    return month


def _labels(team: str, tier: str) -> dict[str, str]:
    return {lbl.MANAGED_BY: lbl.MANAGED_BY_VALUE, lbl.TEAM: team, lbl.TIER: tier}


def _node(name: str, tier: str, gpus: int) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {lbl.TIER: tier, lbl.STABILITY: "stable"}},
        "spec": {},
        "status": {
            "allocatable": {GPU: str(gpus), "cpu": "64"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def _event(node: str, reason: str, message: str, when: float) -> JSON:
    return {
        "metadata": {"name": f"{node}.{int(when)}", "namespace": "default"},
        "involvedObject": {"kind": "Node", "name": node},
        "reason": reason,
        "message": message,
        "type": "Warning" if reason == "DrainStarted" else "Normal",
        "firstTimestamp": stamp(when),
        "lastTimestamp": stamp(when),
        "count": 1,
        "source": {"component": "nodeagent-tiering"},
    }


def _cluster_queue(q: Queue, ns: str) -> JSON:
    entry: JSON = {"name": GPU, "nominalQuota": str(q.nominal)}
    if q.borrowing_limit is not None:
        entry["borrowingLimit"] = str(q.borrowing_limit)
    if q.lending_limit is not None:
        entry["lendingLimit"] = str(q.lending_limit)
    return {
        "apiVersion": GROUP,
        "kind": "ClusterQueue",
        "metadata": {"name": q.name, "labels": _labels(q.team, q.tier)},
        "spec": {
            "cohortName": q.tier,
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "resourceGroups": [
                {"coveredResources": [GPU], "flavors": [{"name": q.tier, "resources": [entry]}]}
            ],
        },
        "status": {},
    }


def _workload(run: Run) -> JSON:
    conditions: list[JSON] = []
    status: JSON = {"conditions": conditions}
    if run.preempted:
        conditions.append(
            {
                "type": "Requeued",
                "status": "True",
                "reason": "Preempted",
                "lastTransitionTime": stamp(run.queued_s),
            }
        )
        conditions.append(
            {
                "type": "Preempted",
                "status": "True",
                "reason": run.preempted,
                "lastTransitionTime": stamp(run.queued_s),
            }
        )
    if run.admitted_s is None:
        conditions.append(
            {
                "type": "QuotaReserved",
                "status": "False",
                "reason": "Pending",
                "message": "couldn't assign flavors to pod set main: insufficient unused quota",
                "lastTransitionTime": stamp(run.queued_s),
            }
        )
    else:
        for kind in ("QuotaReserved", "Admitted"):
            conditions.append(
                {
                    "type": kind,
                    "status": "True",
                    "reason": kind,
                    "lastTransitionTime": stamp(run.admitted_s),
                }
            )
        status["admission"] = {
            "clusterQueue": run.queue,
            "podSetAssignments": [
                {
                    "name": "main",
                    "count": run.pods,
                    "flavors": {GPU: run.tier},
                    "resourceUsage": {GPU: str(run.gpus), "cpu": f"{run.pods * 4}"},
                }
            ],
        }
    if run.finished_s is not None:
        reason = "Succeeded" if run.ending == "done" else "Failed"
        conditions.append(
            {
                "type": "Finished",
                "status": "True",
                "reason": reason,
                "lastTransitionTime": stamp(run.finished_s),
            }
        )
    return {
        "apiVersion": GROUP,
        "kind": "Workload",
        "metadata": {
            "name": f"job-{run.name}",
            "namespace": run.namespace,
            "creationTimestamp": stamp(run.created_s),
        },
        "spec": {
            "queueName": run.tier,
            "podSets": [{"name": "main", "count": run.pods, "template": {"spec": {}}}],
        },
        "status": status,
    }


def _pods(run: Run) -> list[JSON]:
    if run.admitted_s is None:
        return []
    out = []
    for p in range(run.pods):
        status: JSON = {"startTime": stamp(run.admitted_s)}
        if run.finished_s is None:
            status["phase"] = "Running"
        else:
            failed = run.ending != "done"
            status["phase"] = "Failed" if failed else "Succeeded"
            code = 0 if not failed else (137 if run.ending == "drain" else 1)
            status["containerStatuses"] = [
                {
                    "name": "main",
                    "state": {
                        "terminated": {"exitCode": code, "finishedAt": stamp(run.finished_s)}
                    },
                }
            ]
            if run.ending == "drain":
                status["conditions"] = [
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "EvictionByEvictionAPI",
                        "lastTransitionTime": stamp(run.finished_s),
                    }
                ]
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"{run.name}-{p}",
                    "namespace": run.namespace,
                    "labels": {lbl.KUEUE_QUEUE_NAME: run.tier},
                    "creationTimestamp": stamp(run.created_s),
                },
                "spec": {
                    "nodeName": run.node,
                    "containers": [
                        {
                            "name": "main",
                            "resources": {
                                "requests": {GPU: str(run.per_pod)},
                                "limits": {GPU: str(run.per_pod)},
                            },
                        }
                    ],
                },
                "status": status,
            }
        )
    return out


def _status(month: Month) -> None:
    """ClusterQueue status.flavorsUsage now: what the running workloads hold."""
    used: dict[str, int] = {}
    running: dict[str, int] = {}
    for run in month.runs:
        if run.admitted_s is not None and run.finished_s is None:
            used[run.queue] = used.get(run.queue, 0) + run.gpus
            running[run.queue] = running.get(run.queue, 0) + 1
    for cq in month.cluster_queues:
        q = month.queues[cq["metadata"]["name"]]
        total = used.get(q.name, 0)
        cq["status"] = {
            "flavorsUsage": [
                {
                    "name": q.tier,
                    "resources": [
                        {
                            "name": GPU,
                            "total": str(total),
                            "borrowed": str(max(0, total - q.nominal)),
                        }
                    ],
                }
            ],
            "admittedWorkloads": running.get(q.name, 0),
        }
