"""The pool review, built in one place: ``nodeagent tiering report`` calls :func:`build_pool_review`
and only prints or writes what it returns.

Sections, in order: tiers (:mod:`.tiers`), quota and queues (:mod:`.quota`), reserved
capacity (:mod:`.reserve`, with a reserve in the quota policy), shared GPUs (:mod:`.sharing`),
fragmentation (:mod:`.fragmentation`). A new section is a
:class:`~nodeagent_tiering.review.sections.ReviewSection` appended in :func:`assemble_review`
(from what :func:`~nodeagent_tiering.review.inputs.read_inputs` read) or in
:func:`build_pool_review` (when it reads something of its own).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from nodeagent_tiering.cluster.cluster_api import Kube
from nodeagent_tiering.cluster.memory import gc_paused
from nodeagent_tiering.cluster.nodes import Node
from nodeagent_tiering.cluster.tier_policy import TierPolicy
from nodeagent_tiering.pending.mig import MigPlanner
from nodeagent_tiering.quota.flavors import Flavor
from nodeagent_tiering.quota.policy import QuotaPolicy
from nodeagent_tiering.review.fragmentation import read_fragmentation
from nodeagent_tiering.review.inputs import ReviewInputs, read_inputs
from nodeagent_tiering.review.prometheus import PromUsage, query_prometheus, query_usage
from nodeagent_tiering.review.quota import build_section
from nodeagent_tiering.review.reserve import reserve_section
from nodeagent_tiering.review.sharing import sharing_section
from nodeagent_tiering.review.tiers import Review, build_review


def build_pool_review(
    kube: Kube,
    *,
    now_s: float,
    period_s: float,
    planner: MigPlanner,
    namespace: str,
    policy: TierPolicy | None = None,
    quota: QuotaPolicy | None = None,
    flavors: Sequence[Flavor] = (),
    prometheus: str | None = None,
    node_label: str = "node",
    step_s: float = 300.0,
) -> Review:
    """Read the cluster (and Prometheus at ``prometheus``, when given) and build the review.

    ``planner`` is the MIG planner the fragmentation section's live pass asks (the command
    passes ``mig apply``'s, as the service does); ``namespace`` is the service's (its history).

    Raises:
        KubeError: the API server is unreachable or refused a list.
        ReportError: Prometheus is unreachable or refused a query.
    """
    with gc_paused():  # the reads and the build make millions of objects
        inputs = read_inputs(kube, now_s=now_s, period_s=period_s)
        values = query_prometheus(prometheus, node_label) if prometheus else None
        usage = (
            query_usage(prometheus, node_label, period_s=period_s, step_s=step_s)
            if prometheus
            else None
        )
        review = assemble_review(
            inputs,
            policy=policy,
            quota=quota,
            flavors=flavors,
            prometheus=values,
            usage=usage,
            usage_source=f"Prometheus {prometheus}"
            if prometheus
            else "not queried (no --prometheus)",
        )
    review.sections.append(
        read_fragmentation(kube, namespace, policy, planner, now_s=now_s, period_s=period_s)
    )
    return review


def assemble_review(
    inputs: ReviewInputs,
    *,
    policy: TierPolicy | None = None,
    quota: QuotaPolicy | None = None,
    flavors: Sequence[Flavor] = (),
    prometheus: Mapping[str, Mapping[str, float]] | None = None,
    usage: PromUsage | None = None,
    usage_source: str = "not queried (no --prometheus)",
) -> Review:
    """The tier review of what :func:`read_inputs` read, with the quota and shared-GPU sections:
    ``prometheus`` are the tier review's instant values, ``usage`` the quota section's."""
    nodes = [Node.from_object(o) for o in inputs.nodes]
    review = build_review(
        nodes,
        inputs.events,
        policy=policy,
        now_s=inputs.now_s,
        period_s=inputs.period_s,
        prometheus=prometheus,
    )
    review.sections.append(
        build_section(
            inputs, policy=quota, flavors=flavors, prometheus=usage, prometheus_source=usage_source
        )
    )
    reserve = reserve_section(inputs, quota, flavors)
    if reserve is not None:
        review.sections.append(reserve)
    review.sections.append(sharing_section(nodes))
    return review
