"""Nodes kept for large jobs (the quota policy's ``tiers.<tier>.reserve``), chosen and marked.

The quota side is Kueue's (:func:`~nodeagent_tiering.quota.policy.render`): the reserved nodes
are their own ResourceFlavor, whose quota belongs to the ClusterQueue ``<tier>-reserved``; the
tier's teams borrow it while it is idle and Kueue preempts them (``reclaimWithinCohort: Any``)
when a large job arrives. What this module does is the node side, which no Kueue object can:

- :func:`choose_reserved` picks which nodes of the tier are kept: whole, healthy, schedulable
  nodes with at least the reserve's GPUs (all whole GPUs, in one NVLink island where the agent
  published one); those already kept stay kept (a reserve that moves strands what runs there);
  then the nodes with the fewest GPUs in use, so the fewest workloads sit on a node that will
  be reclaimed, and the fragmented nodes stay with the small jobs that fragmented them;
- :class:`ReservedNodes` marks them (label and NoSchedule taint :data:`~nodeagent.labels.RESERVED`,
  which only pods Kueue admits to the reserved flavor tolerate) and unmarks the rest, so a node
  that fails or is drained is replaced at the next sync. The taint keeps new pods of other
  flavors off; it evicts nothing, so a pod already running there finishes where it is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from nodeagent import labels as lbl
from nodeagent_tiering.cluster.cluster_api import Kube, KubeError
from nodeagent_tiering.cluster.nodes import GPU_RESOURCE, Node
from nodeagent_tiering.cluster.tier_policy import Stability
from nodeagent_tiering.quota.flavors import RESERVED_TAINT

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReserveSpec:
    """One tier's reserve, as the service needs it."""

    tier: str
    nodes: int
    gpus: int


@dataclass(frozen=True, slots=True)
class Choice:
    """The nodes a tier keeps, and why the others could not be."""

    tier: str
    kept: tuple[str, ...]
    wanted: int
    refused: Mapping[str, str] = field(default_factory=dict)  # node -> why it cannot be kept

    @property
    def short(self) -> int:
        """How many reserved nodes are missing."""
        return max(0, self.wanted - len(self.kept))


def is_reserved(node: Node) -> bool:
    """Whether the node carries the reserved label."""
    return node.labels.get(lbl.RESERVED) == lbl.RESERVED_VALUE


def why_not(node: Node, gpus: int) -> str | None:
    """Why ``node`` cannot be kept for jobs of ``gpus`` whole GPUs, or None when it can."""
    if node.unschedulable:
        return "cordoned"
    if node.drain is not None:
        return f"held by a drain ({node.drain.phase.value})"
    if node.not_ready:
        return "not Ready"
    if node.state != Stability.STABLE.value:
        return f"{node.state}"
    if node.allocatable.get(GPU_RESOURCE, 0) < gpus:
        return f"{node.allocatable.get(GPU_RESOURCE, 0)} whole GPUs allocatable, {gpus} needed"
    published = node.published
    if published is not None:
        if any(g.mig is not None for g in published.gpus):
            return "MIG enabled on a GPU"
        if any(g.health != "healthy" for g in published.gpus):
            return "a GPU is not healthy"
        islands: dict[int, int] = {}
        for g in published.gpus:
            islands[g.island] = islands.get(g.island, 0) + 1
        if max(islands.values(), default=0) < gpus:
            return f"largest NVLink island {max(islands.values(), default=0)} GPUs, {gpus} needed"
    return None


def gpus_in_use(node: Node) -> int:
    """GPUs a workload holds, as the agent published (0 where it did not say)."""
    if node.published is None:
        return 0
    return sum(1 for g in node.published.gpus if g.pods or g.holder or g.busy)


def choose_reserved(nodes: Iterable[Node], spec: ReserveSpec) -> Choice:
    """The nodes of ``spec.tier`` to keep for its large jobs (see the module doc)."""
    candidates: list[Node] = []
    refused: dict[str, str] = {}
    for node in nodes:
        if node.labels.get(lbl.TIER) != spec.tier:
            continue
        reason = why_not(node, spec.gpus)
        if reason is None:
            candidates.append(node)
        else:
            refused[node.name] = reason
    candidates.sort(key=lambda n: (not is_reserved(n), gpus_in_use(n), n.name))
    kept = tuple(n.name for n in candidates[: spec.nodes])
    return Choice(spec.tier, kept, spec.nodes, refused)


def marking_patch(node: Node, keep: bool) -> dict[str, object] | None:
    """The merge patch that marks (``keep``) or unmarks a node; None when it already is."""
    has_taint = RESERVED_TAINT.on(node.taints)
    if keep == is_reserved(node) and keep == has_taint:
        return None
    others = [t.to_object() for t in node.taints if t.key != lbl.RESERVED]
    if keep:
        others.append(RESERVED_TAINT.taint())
    return {
        "metadata": {
            "labels": {lbl.RESERVED: lbl.RESERVED_VALUE if keep else None},
            # The list is rewritten whole: refuse the write if the node changed since it was read.
            "resourceVersion": node.resource_version,
        },
        "spec": {"taints": others or None},
    }


class ReservedNodes:
    """Keeps each tier's reserved nodes marked (run by the service after its passes)."""

    def __init__(
        self,
        kube: Kube,
        specs: Sequence[ReserveSpec],
        *,
        dry_run: bool = False,
        may_act: Callable[[], bool] | None = None,
        dry_log: Callable[[str], None] | None = None,
    ) -> None:
        self.kube = kube
        self.specs = list(specs)
        self.dry_run = dry_run
        self.may_act = may_act or (lambda: True)
        self.dry_log = dry_log
        self.last: dict[str, Choice] = {}

    def sync(self, nodes: Sequence[Node]) -> dict[str, Choice]:
        """Choose and mark; returns each tier's choice. A failed write is retried next sync."""
        choices = {spec.tier: choose_reserved(nodes, spec) for spec in self.specs}
        keep = {name for c in choices.values() for name in c.kept}
        reserved_tiers = {spec.tier for spec in self.specs}
        for node in nodes:
            wanted = node.name in keep
            # A node marked by an earlier policy, or one that left its tier, is unmarked too.
            if not wanted and not is_reserved(node) and not RESERVED_TAINT.on(node.taints):
                continue
            patch = marking_patch(node, wanted)
            if patch is None:
                continue
            tier = node.labels.get(lbl.TIER, "")
            what = self._describe(node, wanted, choices.get(tier), tier in reserved_tiers)
            if self.dry_run:
                if self.dry_log is not None:
                    self.dry_log(what)
                continue
            if not self.may_act():
                continue
            try:
                self.kube.patch_node(node.name, patch)
            except KubeError as exc:
                log.warning("%s failed: %s; retried at the next sync", what, exc)
                continue
            log.info("%s", what)
        for choice in choices.values():
            previous = self.last.get(choice.tier)
            if choice.short and (previous is None or previous.short != choice.short):
                log.warning(
                    "tier %s: %d of %d nodes kept for large jobs; the others cannot be (%s)",
                    choice.tier,
                    len(choice.kept),
                    choice.wanted,
                    ", ".join(f"{n}: {why}" for n, why in sorted(choice.refused.items()))
                    or "no other node in the tier",
                )
        self.last = choices
        return choices

    @staticmethod
    def _describe(node: Node, keep: bool, choice: Choice | None, tier_reserves: bool) -> str:
        if keep:
            return f"node {node.name}: kept for large jobs (label and taint {lbl.RESERVED})"
        if choice is not None and node.name in choice.refused:
            why = choice.refused[node.name]
            return f"node {node.name}: no longer kept for large jobs ({why}); another replaces it"
        if not tier_reserves:
            return f"node {node.name}: no longer kept for large jobs (its tier keeps none)"
        return f"node {node.name}: no longer kept for large jobs (the reserve is smaller)"
