"""Why each pending GPU workload is pending, and the smallest change that would unblock it.

A pure pass over a :class:`~nodeagent_tiering.cluster.view.ClusterView`: one :class:`Diagnosis` per
pod that the scheduler found unschedulable (or that a scheduling gate holds) and that requests
``nvidia.com/gpu``, ``nvidia.com/mig-<profile>`` or a ``.shared`` variant. Each pod gets one
primary reason, tried in this order:

1. ``quota``: Kueue holds it (its scheduling gate, or its Workload has no ``QuotaReserved=True``);
   fragmentation is then not the cause and nothing else is said.
2. ``other``: by the GPU facts it fits on a node it may use, so the scheduler blocks it for
   something else (CPU, memory, pod affinity...): its own message is the evidence.
3. ``tier``: it fits as things are, but only on nodes its node selector, affinity or tolerations
   exclude, or on cordoned / quarantined / NotReady nodes. Unblock: that node.
4. ``contiguity-gpus``: the nodes it may use have enough free units in total, and one of them has
   enough GPUs, but none has them free at once (or, when the workload asks for it through the
   policy's ``pending.topology_key``, not in one NVLink-connected set / NUMA node). Unblock:
   the node where the fewest running pods would have to move, and their names.
5. ``contiguity-mig``: the GPUs of a node it may use have room for the instances beside the
   ones workloads hold (legal placements and the profile's maximum count, wherever the held
   instances sit: not free slices divided by the size), but no free instance of the profile:
   the layout lacks it, or other instances sit where the profile would be placed. Unblock:
   the GPU (and layout) where the MIG planner
   (``nodeagent_mig.planner.plan_gpu``, the one ``mig apply`` runs, handed to the pass as a
   :class:`MigPlanner` by the composition layer: features do not import each other) admits it
   by destroying the fewest idle instances, never one that is busy or allocated.
6. ``capacity``: none of the above: the nodes it may use lack the units at all.

Fits are judged the way kube-scheduler judges extended resources (node allocatable minus the
requests of the pods bound to it), so a pod called blocked here is one the scheduler reports
``Unschedulable``. Placement facts (which GPU, which slices, which NVLink island) come from each
node's ``nodeagent.io/gpu-state`` annotation. Nothing here changes anything: an unblock is a
suggestion for an operator.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from nodeagent import labels as lbl
from nodeagent_tiering.cluster.memory import gc_paused
from nodeagent_tiering.cluster.nodes import GPU_RESOURCE, Kind, resource_kind
from nodeagent_tiering.cluster.view import KUEUE_GATE, ClusterView, PodInfo, WorkloadInfo
from nodeagent_tiering.pending.capacity import (
    EXCLUDED,
    OK,
    MigGpu,
    NodeState,
    node_causes,
    node_class,
    pinned_tier,
    prepare,
    room_beside_held,
    stranded_for,
    topology_of,
)
from nodeagent_tiering.pending.fits import fits, primary_request, request_text, size_text
from nodeagent_tiering.pending.mig import MigPlan, MigPlanner, gains
from nodeagent_tiering.pending.results import (
    BLOCKING_EFFECTS,
    Diagnosis,
    GpuChange,
    PassResult,
    PoolStats,
    Reason,
    Settings,
    Topology,
    Unblock,
)
from nodeagent_tiering.pending.workloads import (
    QueueMemo,
    diagnose_workload,
    waiting_without_pods,
)


@dataclass(eq=False, repr=False)  # the default repr would print the whole cluster view
class Diagnoser:
    """One pass over a view. ``reuse=False`` is the naive scan (every pod against every node,
    nothing shared between pods but the planner's per-layout answers), kept for the
    benchmark's comparison."""

    view: ClusterView
    settings: Settings
    planner: MigPlanner
    _: KW_ONLY
    reuse: bool = True
    nodes: dict[str, NodeState] = field(init=False)
    order: list[str] = field(init=False)
    _workloads: dict[str, WorkloadInfo] = field(init=False, default_factory=dict)  # owner UID
    _classes: dict[tuple[Any, ...], tuple[list[tuple[int, str]], str]] = field(
        init=False, default_factory=dict
    )
    _memo: dict[tuple[Any, ...], tuple[Reason, str, Unblock | None]] = field(
        init=False, default_factory=dict
    )
    _all_tiers: set[str] | None = field(init=False, default=None)
    _sigs: list[tuple[Any, ...]] | None = field(init=False, default=None)
    _pending: list[PodInfo] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.nodes = prepare(self.view)
        self.order = sorted(self.nodes)
        for wl in self.view.workloads:
            for owner in wl.owners:
                self._workloads[owner] = wl

    # pods

    def pending(self) -> list[PodInfo]:
        """The pods this pass diagnoses, sorted by namespace and name."""
        if self._pending is None:
            out = [p for p in self.view.pods if self._is_pending(p)]
            self._pending = sorted(out, key=lambda p: (p.namespace, p.name))
        return list(self._pending)

    def _is_pending(self, pod: PodInfo) -> bool:
        if pod.node_name or pod.deleting or pod.phase != "Pending" or not pod.requests:
            return False
        if pod.gates:
            return True
        s = pod.scheduled
        if s is not None and s.status == "False" and s.reason == "Unschedulable":
            return True
        return self.settings.assume_unschedulable and (s is None or s.status != "True")

    def _workload(self, pod: PodInfo) -> WorkloadInfo | None:
        for uid in (pod.uid, *pod.owners):
            if uid and uid in self._workloads:
                return self._workloads[uid]
        return None

    def _quota(self, pod: PodInfo) -> tuple[Reason, str] | None:
        wl = self._workload(pod)
        state = ""
        if wl is not None:
            state = f"Workload {wl.key} QuotaReserved={wl.quota_reserved or 'not yet'}"
            if wl.reason or wl.message:
                state += f" ({wl.reason}: {wl.message})" if wl.message else f" ({wl.reason})"
        if KUEUE_GATE in pod.gates:
            if wl is not None and wl.quota_reserved == "True":
                return Reason.OTHER, f"Kueue reserved quota but still gates it: {state}"
            return Reason.QUOTA, "Kueue has not admitted it" + (f": {state}" if state else "")
        if wl is not None and wl.quota_reserved != "True":
            return Reason.QUOTA, f"waits in Kueue for quota: {state}"
        if pod.gates:
            return Reason.OTHER, f"waits for its scheduling gates: {', '.join(pod.gates)}"
        return None

    def _signatures(self) -> list[tuple[Any, ...]]:
        """Per node (in order), all a node's class depends on for the pending pods: the labels
        their selectors and affinities name, taints, cordon, drain, and the name if a pod
        selects by it. Nodes alike answer alike, so each pod class is computed once per kind."""
        if self._sigs is None:
            keys: set[str] = set()
            by_name = False
            for pod in self.pending():
                keys.update(pod.node_selector)
                for term in pod.affinity:
                    keys.update(r.key for r in term.expressions)
                    by_name = by_name or bool(term.fields)
            ordered = sorted(keys)
            self._sigs = [
                (
                    tuple(info.labels.get(k) for k in ordered),
                    info.taints,
                    info.unschedulable,
                    info.draining,
                    info.name if by_name else "",
                )
                for info in (self.nodes[name].info for name in self.order)
            ]
        return self._sigs

    def _node_classes(self, pod: PodInfo) -> tuple[list[tuple[int, str]], str]:
        """How every node stands for the pod, and the pod's tier (shared by equal pods)."""
        key = (tuple(sorted(pod.node_selector.items())), pod.affinity, pod.tolerations)
        if self.reuse and key in self._classes:
            return self._classes[key]
        nodes = self.nodes
        if self.reuse:
            seen: dict[tuple[Any, ...], tuple[int, str]] = {}
            classes = []
            for name, sig in zip(self.order, self._signatures(), strict=True):
                cls = seen.get(sig)
                if cls is None:
                    cls = seen[sig] = node_class(pod, nodes[name].info, self.settings)
                classes.append(cls)
        else:
            classes = [node_class(pod, nodes[name].info, self.settings) for name in self.order]
        result = (classes, self._pod_tier(pod, classes))
        if self.reuse:
            self._classes[key] = result
        return result

    def _pod_tier(self, pod: PodInfo, classes: Sequence[tuple[int, str]]) -> str:
        pinned = pinned_tier(pod)
        if pinned is not None:
            return pinned
        tiers = {
            self.nodes[name].info.tier
            for name, (cls, _) in zip(self.order, classes, strict=True)
            if cls != EXCLUDED
        }
        if not tiers:
            return "none"
        return tiers.pop() if len(tiers) == 1 else "any"

    def diagnose(self, pod: PodInfo) -> Diagnosis:
        """The diagnosis of one pending pod."""
        message = pod.scheduled.message if pod.scheduled is not None else ""
        classes, tier = self._node_classes(pod)
        quota = self._quota(pod)
        if quota is not None:
            return Diagnosis(
                pod.namespace,
                pod.name,
                pod.uid,
                pod.requests,
                quota[0],
                quota[1],
                tier=tier,
                message=message,
            )
        topology = topology_of(pod, self.settings)
        key = (
            tuple(sorted(pod.node_selector.items())),
            pod.affinity,
            pod.tolerations,
            tuple(sorted(pod.requests.items())),
            topology,
        )
        found = self._memo.get(key) if self.reuse else None
        if found is None:
            found = self._classify(pod, topology, classes, message)
            if self.reuse:
                self._memo[key] = found
        reason, evidence, unblock = found
        return Diagnosis(
            pod.namespace,
            pod.name,
            pod.uid,
            pod.requests,
            reason,
            evidence,
            unblock,
            tier=tier,
            message=message,
        )

    def _classify(
        self, pod: PodInfo, topology: Topology, classes: Sequence[tuple[int, str]], message: str
    ) -> tuple[Reason, str, Unblock | None]:
        request = pod.requests
        nodes = self.nodes
        eligible = [nodes[n] for n, (c, _) in zip(self.order, classes, strict=True) if c == OK]
        for node in eligible:
            if fits(node, request, topology):
                said = f"; the scheduler says: {message}" if message else ""
                return (
                    Reason.OTHER,
                    f"its GPUs fit on node {node.info.name} by what the agents publish{said}",
                    None,
                )
        tier = self._tier(pod, topology, classes)
        if tier is not None:
            return tier
        resource, units = primary_request(request)
        kind = resource_kind(resource)
        assert kind is not None
        if kind[0] is Kind.MIG and kind[1] is not None:
            return self._mig(resource, kind[1], units, eligible)
        return self._whole(resource, units, topology, eligible)

    def _tier(
        self, pod: PodInfo, topology: Topology, classes: Sequence[tuple[int, str]]
    ) -> tuple[Reason, str, Unblock | None] | None:
        """A node the pod may not use now would hold it: the one needing the fewest changes
        (back in service before admitted, then the tightest fit)."""
        request = pod.requests
        best: tuple[tuple[int, int, int, str], NodeState, list[str], list[str]] | None = None
        resource = primary_request(request)[0]
        for name, (cls, _) in zip(self.order, classes, strict=True):
            if cls == OK:
                continue
            node = self.nodes[name]
            if not fits(node, request, topology):
                continue
            excluded, service = node_causes(pod, node.info, self.settings)
            rank = (len(excluded) + len(service), len(excluded), node.free.get(resource, 0), name)
            if best is None or rank < best[0]:
                best = (rank, node, excluded, service)
        if best is None:
            return None
        _, node, excluded, service = best
        name, tier = node.info.name, node.info.tier
        req = request_text(request)
        down = f"bring node {name} (tier {tier}) back into service: it is {', '.join(service)}"
        if not excluded:
            evidence = (
                f"no node it may use holds {req} now; node {name} (tier {tier}) would, but it "
                f"is {', '.join(service)}"
            )
            return Reason.TIER, evidence, Unblock("heal-node", name, down)
        why = ", ".join(excluded)
        text = f"admit node {name} (tier {tier}): the pod's {why} excludes it"
        if service:
            text += f"; and {down}"
        evidence = (
            f"no node in the tiers it admits holds {req}; node {name} in tier {tier} would, "
            f"but its {why} excludes it"
        )
        return Reason.TIER, evidence, Unblock("admit-tier", name, text)

    # whole GPUs and shared replicas

    def _whole(
        self, resource: str, units: int, topology: Topology, eligible: Sequence[NodeState]
    ) -> tuple[Reason, str, Unblock | None]:
        need = size_text(units, resource)
        total = sum(max(0, n.free.get(resource, 0)) for n in eligible)
        sizes = {n.info.name: self._largest_set(n, resource, topology) for n in eligible}
        big_enough = [n for n in eligible if sizes[n.info.name] >= units]
        blocks = self._largest_blocks(resource, topology, eligible)
        if not big_enough:
            largest = max(sizes.values(), default=0)
            groups = {
                Topology.NVLINK: " in one NVLink-connected set",
                Topology.NUMA: " on one NUMA node",
            }
            where = groups.get(topology, "") if resource == GPU_RESOURCE else ""
            return (
                Reason.CAPACITY,
                f"no node it may use has {need}{where} at all (the largest has {largest}); "
                f"{total} free in total",
                None,
            )
        counted = [n for n in big_enough if n.free.get(resource, 0) >= units]
        if total < units and not counted:
            return (
                Reason.CAPACITY,
                f"needs {need}; only {total} free on the nodes it may use; "
                f"largest free block per tier: {blocks}",
                None,
            )
        if counted and topology is not Topology.ANY:
            what = "NVLink-connected set" if topology is Topology.NVLINK else "NUMA node"
            evidence = (
                f"needs {need} in one {what}; node {counted[0].info.name} has {units} free, but "
                f"not in one {what}; largest free block per tier: {blocks}"
            )
        else:
            evidence = (
                f"needs {need} on one node; {total} free on the nodes it may use, but at most "
                f"{self._max_free(resource, eligible)} on any one; largest free block per tier: "
                f"{blocks}"
            )
        return Reason.CONTIGUITY_GPUS, evidence, self._moves(resource, units, topology, big_enough)

    @staticmethod
    def _largest_set(node: NodeState, resource: str, topology: Topology) -> int:
        """The most units of ``resource`` the node could ever give one pod (in one group when
        the pod asks for a topology and the agent publishes it)."""
        units = node.info.allocatable.get(resource, 0)
        pub = node.info.published
        if topology is Topology.ANY or resource != GPU_RESOURCE or pub is None:
            return units
        group_of = node.group_of.get(topology, {})
        sizes = Counter(
            group_of.get(g.index, 0) for g in pub.gpus if g.mig is None and g.schedulable
        )
        return min(units, max(sizes.values(), default=0))

    def _max_free(self, resource: str, nodes: Iterable[NodeState]) -> int:
        return max((max(0, n.free.get(resource, 0)) for n in nodes), default=0)

    def _largest_blocks(self, resource: str, topology: Topology, nodes: Sequence[NodeState]) -> str:
        best: dict[str, tuple[int, str]] = {}
        for n in nodes:
            if not n.info.allocatable.get(resource):
                continue
            free = max(0, n.free.get(resource, 0))
            if topology is not Topology.ANY and resource == GPU_RESOURCE:
                groups = n.groups.get(topology) or [0]
                free = min(free, groups[0])
            tier = n.info.tier
            if tier not in best or free > best[tier][0]:
                best[tier] = (free, n.info.name)
        return ", ".join(f"{t} {f} ({name})" for t, (f, name) in sorted(best.items())) or "none"

    def _moves(
        self, resource: str, units: int, topology: Topology, nodes: Sequence[NodeState]
    ) -> Unblock | None:
        best: tuple[tuple[int, int, str], tuple[tuple[str, int], ...]] | None = None
        for node in nodes:
            chosen = self._pods_to_move(node, resource, units, topology)
            if chosen is None:
                continue
            rank = (len(chosen), sum(u for _, u in chosen), node.info.name)
            if best is None or rank < best[0]:
                best = (rank, chosen)
        if best is None:
            return None
        (_, _, name), chosen = best
        listed = ", ".join(f"{pod} ({u})" for pod, u in chosen)
        text = f"move {listed} off node {name}; then {size_text(units, resource)} are free there"
        return Unblock("move-pods", name, text, pods=tuple(p for p, _ in chosen))

    def _pods_to_move(
        self, node: NodeState, resource: str, units: int, topology: Topology
    ) -> tuple[tuple[str, int], ...] | None:
        """The fewest bound pods whose leaving frees ``units`` (in one group if asked)."""
        running = sorted(node.users.get(resource, []), key=lambda pu: (-pu[1], pu[0]))
        pub = node.info.published
        grouped = topology is not Topology.ANY and resource == GPU_RESOURCE
        if grouped and pub is not None and pub.allocations_known:
            return self._group_moves(node, units, topology)
        # Without who-holds-what (no pod-resources) a grouped request is counted as the
        # scheduler counts: approximate, see docs/tiering.md.
        need = units - node.free.get(resource, 0)
        chosen: list[tuple[str, int]] = []
        for pod, u in running:
            if need <= 0:
                break
            chosen.append((pod, u))
            need -= u
        return tuple(chosen) if need <= 0 and chosen else None

    def _group_moves(
        self, node: NodeState, units: int, topology: Topology
    ) -> tuple[tuple[str, int], ...] | None:
        """With holders known: the group (island, NUMA node) freed by the fewest pods."""
        group_of = node.group_of.get(topology, {})
        pub = node.info.published
        assert pub is not None
        members: dict[int, list[int]] = {}
        for g in pub.gpus:
            if g.mig is None and g.schedulable:
                members.setdefault(group_of.get(g.index, 0), []).append(g.index)
        held_by: dict[str, int] = Counter(node.holders.values())
        best: tuple[int, tuple[tuple[str, int], ...]] | None = None
        for gpus in members.values():
            if len(gpus) < units:
                continue
            free = sum(1 for i in gpus if i not in node.holders)
            in_group = Counter(node.holders[i] for i in gpus if i in node.holders)
            chosen = []
            for pod, k in sorted(in_group.items(), key=lambda pk: (-pk[1], pk[0])):
                if free >= units:
                    break
                chosen.append((pod, held_by[pod]))
                free += k
            if free >= units and chosen and (best is None or len(chosen) < best[0]):
                best = (len(chosen), tuple(chosen))
        return best[1] if best is not None else None

    # MIG

    def _mig(
        self, resource: str, profile: str, units: int, eligible: Sequence[NodeState]
    ) -> tuple[Reason, str, Unblock | None]:
        need = size_text(units, resource)
        known = [n for n in eligible if n.info.published is not None]
        if eligible and not known:
            return (
                Reason.OTHER,
                f"needs {need}; no node it may use publishes its GPU state "
                f"({lbl.GPU_STATE_ANNOTATION}): is the agent running there?",
                None,
            )
        size = 0  # memory slices of one instance (the model's placements, not the "3" in 3g)
        most_free = 0
        most_room: tuple[int, str] = (0, "")  # the node with room for the most new instances
        roomy: list[NodeState] = []
        for node in known:
            room = 0
            for g in node.mig:
                p = g.geometry.profile(profile)
                if p is None or not p.placements:
                    continue
                size = p.placements[0].size
                most_free = max(most_free, g.free_slices)
                room += room_beside_held(g, profile)
            most_room = max(most_room, (room, node.info.name))
            if room >= units:
                roomy.append(node)
        if not roomy:
            if not size:
                return Reason.CAPACITY, f"needs {need}; no GPU it may use offers {profile}", None
            if most_room[0] == 0:
                return (
                    Reason.CAPACITY,
                    f"needs {need}; a {profile} takes {size} memory slices, and no GPU it may use "
                    f"has that many that no workload holds (at most {most_free} on one GPU)",
                    None,
                )
            return (
                Reason.CAPACITY,
                f"needs {need}; beside the instances workloads hold, the GPUs of one node have "
                f"room for at most {most_room[0]} {profile} (node {most_room[1]}), whatever "
                "the layout and wherever the held instances sit",
                None,
            )
        best: tuple[tuple[int, int, str], NodeState, list[tuple[MigGpu, MigPlan]]] | None = None
        for node in roomy:
            found = self._mig_node_plan(node, profile, units - max(0, node.free.get(resource, 0)))
            if found is None:
                continue
            cost, plans = found
            rank = (cost, len(plans), node.info.name)
            if best is None or rank < best[0]:
                best = (rank, node, plans)
            if cost == 0 and len(plans) <= 1:
                break  # nothing to destroy, on one GPU: nodes come by name, none ranks higher
        if best is None:
            where = ", ".join(n.info.name for n in roomy[:3]) + (" ..." if len(roomy) > 3 else "")
            evidence = (
                f"needs {need}; GPUs on {where} could hold it beside what workloads hold, but "
                f"every legal placement of {profile} overlaps a busy or allocated instance"
            )
            return Reason.CONTIGUITY_MIG, evidence, None
        _, node, plans = best
        changes = tuple(
            GpuChange(
                g.index,
                plan.destroy,
                plan.create,
                plan.layout,
            )
            for g, plan in plans
        )
        parts = []
        for c in changes:
            gone = ", ".join(s.label for s in c.destroy)
            made = ", ".join(s.label for s in c.create)
            parts.append(
                f"GPU {c.gpu}: " + (f"destroy idle {gone}, " if gone else "") + f"create {made}"
            )
        name = node.info.name
        text = f"change the MIG layout on node {name}: " + "; ".join(parts) + " (no busy instance)"
        first = changes[0]
        gpu = next(g for g in node.mig if g.index == first.gpu)
        p = gpu.geometry.profile(profile)
        starts = ", ".join(str(q.start) for q in p.placements) if p is not None else ""
        here = (
            f"GPU {gpu.index} of node {name} has {gpu.free_slices} memory slices that no "
            "workload holds"
        )
        if first.destroy:
            idle = ", ".join(sorted({s.profile for s in first.destroy}))
            why = (
                f"{here}, but idle {idle} instances sit where a {profile} ({size} slices, "
                f"starting at slice {starts}) would go"
            )
        else:
            why = f"{here} and room for a {profile}, but its layout has no free {profile} instance"
        evidence = f"needs {need}; {why}"
        return Reason.CONTIGUITY_MIG, evidence, Unblock("mig-layout", name, text, changes=changes)

    def _mig_node_plan(
        self, node: NodeState, profile: str, missing: int
    ) -> tuple[int, list[tuple[MigGpu, MigPlan]]] | None:
        """The fewest destroyed instances over the node's GPUs that gain ``missing`` free
        ``profile`` instances (a small knapsack over each GPU's options)."""
        if missing <= 0:
            return 0, []
        best: dict[int, tuple[int, list[tuple[MigGpu, MigPlan]]]] = {0: (0, [])}
        for g in node.mig:
            options = self._gpu_gains(g, profile, missing)
            step = dict(best)
            for have, (cost, plans) in best.items():
                for j, plan in enumerate(options, start=1):
                    if plan is None:
                        continue
                    total = min(missing, have + j)
                    entry = (cost + len(plan.destroy), [*plans, (g, plan)])
                    old = step.get(total)
                    if old is None or (entry[0], len(entry[1])) < (old[0], len(old[1])):
                        step[total] = entry
            best = step
        return best.get(missing)

    def _gpu_gains(self, g: MigGpu, profile: str, most: int) -> tuple[MigPlan | None, ...]:
        return gains(self.planner, g.geometry, g.slots, profile, most)

    # the pool

    def stats(self, diagnoses: Sequence[Diagnosis]) -> PoolStats:
        """Free-but-unusable capacity per tier, against what the blocked pods ask for.

        Demand is the blocked pods (not quota, not other): a free GPU is unusable when its node's
        free count is not a multiple of the smallest blocked whole-GPU request that may use the
        tier (the exporter's stranded-GPU rule, with the pending sizes as request sizes); a free
        slice is unusable for a profile when no free legal placement of it covers the slice.
        """
        smallest: dict[str, int] = {}
        profiles: dict[str, set[str]] = {}
        for d in diagnoses:
            if d.reason in (Reason.QUOTA, Reason.OTHER):
                continue
            resource, units = primary_request(d.request)
            kind = resource_kind(resource)
            for tier in self._tiers_of(d):
                if resource == GPU_RESOURCE:
                    smallest[tier] = min(smallest.get(tier, units), units)
                elif kind is not None and kind[0] is Kind.MIG and kind[1] is not None:
                    profiles.setdefault(tier, set()).add(kind[1])
        free: dict[str, int] = {}
        block: dict[str, int] = {}
        unusable: dict[str, int] = {}
        slices: dict[tuple[str, str], int] = {}
        blocks: dict[str, dict[int, int]] = {}
        fit: dict[tuple[str, str], int] = {}
        mig_free: dict[str, int] = {}
        by_node: dict[str, tuple[int, int]] = {}
        for name in self.order:
            node = self.nodes[name]
            info = node.info
            if info.unschedulable or any(
                t.key in self.settings.service_taints and t.effect in BLOCKING_EFFECTS
                for t in info.taints
            ):
                continue
            tier = info.tier
            f = max(0, node.free.get(GPU_RESOURCE, 0))
            free[tier] = free.get(tier, 0) + f
            if f:
                sizes = blocks.setdefault(tier, {})
                sizes[f] = sizes.get(f, 0) + f
            groups = node.groups.get(Topology.NVLINK)
            largest = min(f, groups[0] if groups else 0) if groups is not None else 0
            block[tier] = max(block.get(tier, 0), largest)
            stranded_gpus = 0
            if tier in smallest:
                stranded_gpus = f - (f // smallest[tier]) * smallest[tier]
                unusable[tier] = unusable.get(tier, 0) + stranded_gpus
            stranded = 0
            summary = node.summary
            if node.mig:
                mig_free[tier] = mig_free.get(tier, 0) + summary.free
                for profile, n in summary.unusable.items():
                    slices[(tier, profile)] = slices.get((tier, profile), 0) + n
                    fit[(tier, profile)] = fit.get((tier, profile), 0) + summary.fit[profile]
            wanted = profiles.get(tier)
            if wanted:
                ordered = tuple(sorted(wanted))
                for g in node.mig:
                    stranded += stranded_for(g.geometry, g.shape, ordered)
            if stranded_gpus or stranded:
                by_node[name] = (stranded_gpus, stranded)
        for tier in free:
            unusable.setdefault(tier, 0)
        return PoolStats(free, block, unusable, slices, blocks, fit, mig_free, by_node)

    def _tiers_of(self, d: Diagnosis) -> set[str]:
        if d.tier not in ("any", "none"):
            return {d.tier}
        if self._all_tiers is None:
            self._all_tiers = {n.info.tier for n in self.nodes.values()}
        return self._all_tiers

    def run(self) -> PassResult:
        """Diagnose every pending GPU pod, and every Workload waiting in Kueue with no pod.

        The cyclic garbage collector is paused for the pass: the view holds millions of
        objects, every full collection walks them all, and the pass makes no cycles; with it
        on, collections landed in passes and took p99 over a second at 5,000 nodes and 10,000
        Workloads (docs/benchmarks.md).
        """
        with gc_paused():
            diagnoses = (*(self.diagnose(p) for p in self.pending()), *self.workloads())
            return PassResult(diagnoses, self.stats(diagnoses))

    def workloads(self, namespace: str | None = None, name: str | None = None) -> list[Diagnosis]:
        """The Workloads waiting for quota before any pod exists (of ``namespace``, and the
        one whose job or Workload is called ``name``)."""
        queues = {cq.name: cq for cq in self.view.cluster_queues}
        memo = QueueMemo()
        return [
            diagnose_workload(w, self.view, queues, memo)
            for w in waiting_without_pods(self.view)
            if (namespace is None or w.namespace == namespace)
            and (name is None or name in (w.name, w.owner.name if w.owner else w.name))
        ]


def diagnose(
    view: ClusterView, planner: MigPlanner, settings: Settings | None = None
) -> PassResult:
    """One diagnosis pass over ``view`` (see the module docstring)."""
    return Diagnoser(view, settings or Settings(), planner).run()


def diagnose_some(
    view: ClusterView,
    planner: MigPlanner,
    settings: Settings | None = None,
    *,
    namespace: str | None = None,
    pod: str | None = None,
) -> PassResult:
    """The diagnoses of the pending GPU pods of ``namespace`` (every namespace when ``None``),
    or of the one pod ``pod`` there; the pool statistics are left empty (``why-pending``)."""
    diagnoser = Diagnoser(view, settings or Settings(), planner)
    chosen = [
        p
        for p in diagnoser.pending()
        if (namespace is None or p.namespace == namespace) and (pod is None or p.name == pod)
    ]
    found = (*(diagnoser.diagnose(p) for p in chosen), *diagnoser.workloads(namespace, pod))
    return PassResult(found, diagnoser.stats(()))
