"""Kueue Workloads that wait for quota before any pod exists, and by how much their queue is short.

The usual Kueue path is a suspended job (a ``batch/v1`` Job, a JobSet, a RayJob...): Kueue makes
a Workload for it and creates no pod until the Workload is admitted, so a diagnosis of pods alone
sees nothing. Here the Workload is the unit: one :class:`Diagnosis` per Workload that asks for
GPUs, is neither admitted nor finished, and has no pod yet (pods, once they exist, are diagnosed
as pods, with their Workload's state in the evidence).

The evidence is Kueue's own ``QuotaReserved`` message, then the arithmetic behind it from the
objects Kueue reads: the LocalQueue's ClusterQueue, per flavor of the resource its guarantee
(``nominalQuota``), what it uses now (``status.flavorsUsage``), what the other queues of its
cohort could lend (their unused guarantee, at most their ``lendingLimit``) and what it may still
borrow (``borrowingLimit``), and the shortfall. Kueue decides; this only says where the numbers
come from. A cohort tree (a Cohort with a parent) is read as its own level only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from nodeagent_tiering.cluster import units
from nodeagent_tiering.cluster.view import ClusterQueueInfo, ClusterView, WorkloadInfo
from nodeagent_tiering.pending.fits import request_text
from nodeagent_tiering.pending.results import Diagnosis, Reason


def waiting_without_pods(view: ClusterView) -> list[WorkloadInfo]:
    """Workloads asking for GPUs, not admitted, not finished, with no pod in the view, by key."""
    owners = {uid for pod in view.pods for uid in (pod.uid, *pod.owners) if uid}
    out = [
        w
        for w in view.workloads
        if w.wanted  # parsed only while not admitted and not finished
        and w.quota_reserved != "True"
        and not any(uid in owners for uid in w.owners)
    ]
    return sorted(out, key=lambda w: (w.namespace, w.owner.name if w.owner else w.name))


@dataclass(frozen=True, slots=True)
class Shortfall:
    """One flavor's arithmetic for one resource of a Workload's ClusterQueue."""

    flavor: str
    resource: str
    asked: float
    guaranteed: float
    used: float
    lendable: float  # what the cohort's other queues could lend now
    borrowable: float | None  # what the queue may still borrow (None: no borrowingLimit)
    # The most it could ever have with the cohort idle: its guarantee plus every other queue's
    # guarantee (at most its lendingLimit), at most its borrowingLimit: Kueue's "maximum
    # capacity". A job asking more is never admitted while the quota stays as it is.
    ceiling: float

    @property
    def available(self) -> float:
        """What the queue could admit now: its unused guarantee plus what it could borrow."""
        borrow = self.lendable if self.borrowable is None else min(self.lendable, self.borrowable)
        return max(0.0, self.guaranteed - self.used) + max(0.0, borrow)

    @property
    def short(self) -> float:
        """How much more it would need (0: the numbers leave room)."""
        return max(0.0, self.asked - self.available)

    def text(self) -> str:
        n = units.quantity_text
        parts = [f"{n(self.guaranteed)} guaranteed", f"{n(self.used)} in use"]
        parts.append(f"the cohort could lend {n(self.lendable)}")
        if self.borrowable is not None:
            parts.append(f"it may borrow {n(max(0.0, self.borrowable))} more")
        if self.asked > self.ceiling:
            verdict = (
                f"the {n(self.asked)} asked are more than it can ever admit ({n(self.ceiling)} "
                "with the whole cohort idle): it waits until the quota or the job changes"
            )
        elif self.short:
            verdict = f"short {n(self.short)} of the {n(self.asked)} asked"
        else:
            verdict = f"room for the {n(self.asked)} asked by these numbers"
        return f"{self.resource} in flavor {self.flavor}: {', '.join(parts)}: {verdict}"


def _used(cq: ClusterQueueInfo) -> dict[tuple[str, str], tuple[float, float]]:
    return {(f, r): (total, borrowed) for f, r, total, borrowed in cq.usage}


@dataclass(frozen=True, slots=True)
class _FlavorNumbers:
    """What a queue's flavor offers for one resource, whoever asks (see :class:`Shortfall`)."""

    flavor: str
    guaranteed: float
    used: float
    lendable: float
    borrowable: float | None
    ceiling: float


@dataclass
class QueueMemo:
    """One pass's answers per queue: thousands of Workloads wait in a few dozen queues, most
    asking one of a few shapes."""

    numbers: dict[tuple[str, str], list[_FlavorNumbers]] = field(default_factory=dict)
    texts: dict[tuple[str, tuple[tuple[str, int], ...]], str] = field(default_factory=dict)


def _flavor_numbers(
    cq: ClusterQueueInfo, queues: Mapping[str, ClusterQueueInfo], resource: str
) -> list[_FlavorNumbers]:
    used = _used(cq)
    cohort = [
        other
        for other in queues.values()
        if cq.cohort and other.cohort == cq.cohort and other.name != cq.name
    ]
    out = []
    for (flavor, name), guaranteed in cq.nominal.items():
        if name != resource:
            continue
        total, borrowed = used.get((flavor, resource), (0.0, 0.0))
        lendable = potential = 0.0
        key = (flavor, resource)
        for other in cohort:
            if key not in other.nominal:
                continue
            cap = other.lending.get(key, other.nominal[key])
            spare = other.nominal[key] - _used(other).get(key, (0.0, 0.0))[0]
            lendable += max(0.0, min(spare, cap))
            potential += max(0.0, min(other.nominal[key], cap))
        limit = cq.borrowing.get(key)
        out.append(
            _FlavorNumbers(
                flavor,
                guaranteed,
                total,
                lendable,
                None if limit is None else limit - borrowed,
                guaranteed + (potential if limit is None else min(potential, limit)),
            )
        )
    return out


def shortfalls(
    cq: ClusterQueueInfo,
    queues: Mapping[str, ClusterQueueInfo],
    asked: Mapping[str, int],
    memo: QueueMemo | None = None,
) -> list[Shortfall]:
    """Per resource asked, the flavor of ``cq`` that comes closest (Kueue tries them in order;
    the closest is the change that would admit it soonest). ``memo`` keeps each queue's numbers
    for the pass: thousands of Workloads wait in a few dozen queues."""
    out = []
    for resource, amount in sorted(asked.items()):
        key = (cq.name, resource)
        numbers = memo.numbers.get(key) if memo is not None else None
        if numbers is None:
            numbers = _flavor_numbers(cq, queues, resource)
            if memo is not None:
                memo.numbers[key] = numbers
        options = [
            Shortfall(
                n.flavor,
                resource,
                float(amount),
                n.guaranteed,
                n.used,
                n.lendable,
                n.borrowable,
                n.ceiling,
            )
            for n in numbers
        ]
        if options:
            out.append(min(options, key=lambda s: (s.asked > s.ceiling, s.short, s.flavor)))
    return out


def _state(w: WorkloadInfo) -> str:
    state = f"Workload {w.key} QuotaReserved={w.quota_reserved or 'not yet'}"
    if w.message:
        state += f" ({w.reason}: {w.message})" if w.reason else f" ({w.message})"
    elif w.reason:
        state += f" ({w.reason})"
    return state


def _queue_text(
    cq: ClusterQueueInfo,
    queues: Mapping[str, ClusterQueueInfo],
    asked: Mapping[str, int],
    memo: QueueMemo | None,
) -> str:
    where = f"ClusterQueue {cq.name}" + (f" (cohort {cq.cohort})" if cq.cohort else "")
    found = shortfalls(cq, queues, asked, memo)
    if found:
        return f"; {where}: " + "; ".join(s.text() for s in found)
    return f"; {where} has no quota for {', '.join(sorted(asked))}"


def diagnose_workload(
    w: WorkloadInfo,
    view: ClusterView,
    queues: Mapping[str, ClusterQueueInfo],
    memo: QueueMemo | None = None,
) -> Diagnosis:
    """The diagnosis of a Workload with no pod yet: its owner (the job) named, Kueue's message,
    and the queue arithmetic."""
    asked = w.requests
    owner = w.owner
    head = f"{owner.kind} {w.namespace}/{owner.name}" if owner else f"Workload {w.key}"
    reason = Reason.QUOTA
    if not w.active:
        reason = Reason.OTHER
        evidence = (
            f"{head} is deactivated (Workload {w.key} spec.active=false): Kueue does not admit "
            "it until it is set back to true"
        )
    elif not w.queue:
        reason = Reason.OTHER
        evidence = f"{head}: Workload {w.key} names no LocalQueue, so no ClusterQueue admits it"
    else:
        cq_name = view.local_queues.get((w.namespace, w.queue))
        evidence = f"{head} waits in Kueue for quota ({request_text(asked)}): {_state(w)}"
        if cq_name is None:
            if view.local_queues or view.cluster_queues:  # else the queues were not read
                reason = Reason.OTHER  # no quota freed anywhere admits it
                evidence += (
                    f"; LocalQueue {w.namespace}/{w.queue} does not exist: Kueue never admits "
                    "it (create the queue, or submit to one that exists)"
                )
        elif (cq := queues.get(cq_name)) is None:
            reason = Reason.OTHER
            evidence += f"; ClusterQueue {cq_name} (of LocalQueue {w.queue}) does not exist"
        else:
            shape = (cq.name, tuple(sorted(asked.items())))
            text = memo.texts.get(shape) if memo is not None else None
            if text is None:
                text = _queue_text(cq, queues, asked, memo)
                if memo is not None:
                    memo.texts[shape] = text
            evidence += text
    return Diagnosis(
        w.namespace,
        owner.name if owner else w.name,
        owner.uid if owner else w.uid,
        asked,
        reason,
        evidence,
        kind=owner.kind if owner else "Workload",
        api_version=owner.api_version if owner else "kueue.x-k8s.io/v1beta1",
        workload=w.name,
    )
