"""Property: on small random clusters the diagnosis agrees with an independent brute force.

The brute force enumerates every legal MIG layout of a GPU (a few thousand on an H100) and every
subset of the pods on a node. For each random cluster and pending pod it checks that the reason
is the one the definitions give, that the unblocking change is as small as any that exists, and
that applying it (in the simulated cluster) admits the pod without destroying a busy instance.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field, replace

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from nodeagent.gpu.types import MigGeometry
from nodeagent_tiering.cluster.nodes import resource_kind
from nodeagent_tiering.pending.results import Reason, Unblock
from tests.tiering.pending.builders import (
    A30,
    H100,
    Cluster,
    diagnose,
    geometry,
    mig_resource,
)

GPU = "nvidia.com/gpu"
TAINT = {"key": "pool", "value": "reserved", "effect": "NoSchedule"}
TOLERATE = {"key": "pool", "operator": "Equal", "value": "reserved", "effect": "NoSchedule"}


@dataclass
class Whole:
    name: str
    gpus: int
    pods: list[tuple[str, list[int]]]  # pod name -> GPU indices it holds
    islands: list[int]
    tainted: bool = False
    cordoned: bool = False


@dataclass
class Mig:
    name: str
    preset: str
    gpus: list[list[tuple[str, int, bool]]]  # per GPU: (profile, start, busy)
    tainted: bool = False
    cordoned: bool = False


@dataclass
class World:
    nodes: list[Whole | Mig]
    request: tuple[str, int]
    tolerates: bool = False
    nvlink: bool = False
    extra_tolerations: list[dict[str, str]] = field(default_factory=list)

    def cluster(self) -> Cluster:
        c = Cluster()
        for n in self.nodes:
            taints = [TAINT] if n.tainted else []
            if isinstance(n, Whole):
                c.whole(
                    n.name,
                    gpus=n.gpus,
                    used=[len(g) for _, g in n.pods],
                    at=[g for _, g in n.pods],
                    names=[p for p, _ in n.pods],
                    islands=n.islands,
                    taints=taints,
                    unschedulable=n.cordoned,
                )
            else:
                layouts = [[f"{p}@{s}{'*' if b else ''}" for p, s, b in gpu] for gpu in n.gpus]
                c.mig(n.name, layouts, preset=n.preset, taints=taints, unschedulable=n.cordoned)
        tolerations = [TOLERATE] if self.tolerates else []
        tolerations += self.extra_tolerations
        labels = {"nodeagent.io/gpu-topology": "nvlink"} if self.nvlink else {}
        resource, units = self.request
        return c.pending("job", {resource: units}, tolerations=tolerations, labels=labels)


# --- random worlds ------------------------------------------------------------------------------


def _layout(draw: st.DrawFn, geo: MigGeometry) -> list[tuple[str, int, bool]]:
    """A random legal layout: placements tried in a random order, kept when they fit."""
    candidates = [
        (p.name, q.start, q.size, p.max_count) for p in geo.profiles for q in p.placements
    ]
    order = draw(st.permutations(candidates))
    keep = draw(st.integers(0, 4))
    used = 0
    counts: dict[str, int] = {}
    out = []
    for name, start, size, most in order:
        if len(out) >= keep:
            break
        mask = ((1 << size) - 1) << start
        if mask & used or counts.get(name, 0) >= most:
            continue
        used |= mask
        counts[name] = counts.get(name, 0) + 1
        out.append((name, start, draw(st.booleans())))
    return sorted(out, key=lambda i: i[1])


def _pods_on(
    draw: st.DrawFn, node: int, gpus: int, count: st.SearchStrategy[int], largest: int
) -> list[tuple[str, list[int]]]:
    """Running pods of whole-GPU node ``node``: each takes 1..``largest`` GPUs, the next ones of
    a shuffle of the node's GPUs, until ``count`` pods or a pod that no longer fits."""
    free = list(draw(st.permutations(range(gpus))))
    pods = []
    for k in range(draw(count)):
        size = draw(st.integers(1, largest))
        if size > len(free):
            break
        pods.append((f"p{node}-{k}", sorted(free[:size])))
        free = free[size:]
    return pods


@st.composite
def worlds(draw: st.DrawFn) -> World:
    nodes: list[Whole | Mig] = []
    shape = draw(st.sampled_from(["mixed", "whole", "mig"]))
    for i in range(draw(st.integers(1, 3))):
        flags = {"tainted": draw(st.booleans()) and draw(st.booleans()),
                 "cordoned": draw(st.integers(0, 5)) == 0}  # fmt: skip
        whole = shape == "whole" or (shape == "mixed" and draw(st.booleans()))
        if whole:
            gpus = draw(st.sampled_from([4, 8]))
            islands = [0] * gpus if draw(st.booleans()) else [i - i % 2 for i in range(gpus)]
            pods = _pods_on(draw, i, gpus, st.integers(0, 4), largest=4)
            nodes.append(Whole(f"w{i}", gpus, pods, islands, **flags))
        else:
            preset = draw(st.sampled_from([H100, A30]))
            geo = geometry(preset)
            gpus = [_layout(draw, geo) for _ in range(draw(st.integers(1, 2)))]
            nodes.append(Mig(f"m{i}", preset, gpus, **flags))
    migs = [n for n in nodes if isinstance(n, Mig)]
    if migs and (shape == "mig" or draw(st.booleans())):
        geo = geometry(draw(st.sampled_from(migs)).preset)
        profile = draw(st.sampled_from([p.name for p in geo.profiles]))
        request = (mig_resource(profile), draw(st.integers(1, 2)))
        nvlink = False
    else:
        request = (GPU, draw(st.integers(1, 8)))
        nvlink = draw(st.integers(0, 3)) == 0
    return World(nodes, request, tolerates=draw(st.booleans()), nvlink=nvlink)


# --- the brute force ----------------------------------------------------------------------------


def _eligible(w: World, n: Whole | Mig) -> str:
    """ok | service (cordoned) | excluded (untolerated taint)."""
    if n.tainted and not w.tolerates:
        return "excluded"
    return "service" if n.cordoned else "ok"


def _all_layouts(geo: MigGeometry) -> list[frozenset[tuple[str, int]]]:
    starts: dict[int, list[tuple[str, int, int]]] = {}
    for p in geo.profiles:
        for q in p.placements:
            starts.setdefault(q.start, []).append((p.name, q.size, p.max_count))
    out: list[frozenset[tuple[str, int]]] = []

    def dfs(s: int, chosen: list[tuple[str, int]], counts: dict[str, int]) -> None:
        if s >= geo.memory_slices:
            out.append(frozenset(chosen))
            return
        dfs(s + 1, chosen, counts)
        for name, size, most in starts.get(s, []):
            if s + size <= geo.memory_slices and counts.get(name, 0) < most:
                counts[name] = counts.get(name, 0) + 1
                dfs(s + size, [*chosen, (name, s)], counts)
                counts[name] -= 1

    dfs(0, [], {})
    return out


_LAYOUTS: dict[str, list[frozenset[tuple[str, int]]]] = {}


def _gpu_options(preset: str, gpu: list[tuple[str, int, bool]], profile: str) -> dict[int, int]:
    """gain -> fewest destroyed instances, over every legal layout keeping the busy ones."""
    geo = geometry(preset)
    layouts = _LAYOUTS.setdefault(preset, _all_layouts(geo))
    current = {(p, s) for p, s, _ in gpu}
    busy = {(p, s) for p, s, b in gpu if b}
    free_now = sum(1 for p, _, b in gpu if p == profile and not b)
    best: dict[int, int] = {}
    for layout in layouts:
        if not busy <= layout:
            continue
        gain = sum(1 for p, s in layout if p == profile and (p, s) not in busy) - free_now
        cost = len(current - layout)
        if gain > 0 and cost < best.get(gain, 1 << 30):
            best[gain] = cost
    return best


def _gpu_room(preset: str, gpu: list[tuple[str, int, bool]], profile: str) -> int:
    """The most instances of ``profile`` a legal layout holds beside instances of the busy
    ones' profiles, wherever those sit (over every legal layout)."""
    layouts = _LAYOUTS.setdefault(preset, _all_layouts(geometry(preset)))
    busy = Counter(p for p, _, b in gpu if b)
    best = 0
    for layout in layouts:
        have = Counter(p for p, _ in layout)
        if all(have[p] >= n for p, n in busy.items()):
            best = max(best, have[profile] - busy[profile])
    return best


def _node_mig_cost(n: Mig, profile: str, need: int) -> int | None:
    """Fewest destroyed instances over the node's GPUs that gain ``need`` free instances."""
    if need <= 0:
        return 0
    reach = {0: 0}
    for gpu in n.gpus:
        options = _gpu_options(n.preset, gpu, profile)
        step = dict(reach)
        for have, cost in reach.items():
            for gain, c in options.items():
                total = min(need, have + gain)
                step[total] = min(step.get(total, 1 << 30), cost + c)
        reach = step
    return reach.get(need)


def _whole_free(n: Whole) -> tuple[int, list[int]]:
    held = {i for _, g in n.pods for i in g}
    free = [i for i in range(n.gpus) if i not in held]
    islands: dict[int, int] = {}
    for i in free:
        islands[n.islands[i]] = islands.get(n.islands[i], 0) + 1
    return len(free), sorted(islands.values(), reverse=True) or [0]


def _fits(w: World, n: Whole | Mig) -> bool:
    resource, units = w.request
    if isinstance(n, Whole):
        if resource != GPU:
            return False
        free, islands = _whole_free(n)
        return free >= units and (not w.nvlink or islands[0] >= units)
    if resource == GPU:
        return False
    profile = _profile(resource)
    free = sum(1 for gpu in n.gpus for p, _, b in gpu if p == profile and not b)
    return free >= units


def _profile(resource: str) -> str:
    kind = resource_kind(resource)
    assert kind is not None
    assert kind[1] is not None
    return kind[1]


def _fewest_moves(w: World, n: Whole) -> int | None:
    units = w.request[1]
    if n.gpus < units:
        return None
    for k in range(len(n.pods) + 1):
        for gone in itertools.combinations(n.pods, k):
            left = Whole(n.name, n.gpus, [p for p in n.pods if p not in gone], n.islands)
            if _fits(replace(w, nodes=[left]), left):
                return k
    return None


def brute(w: World) -> tuple[Reason, int | None]:
    """The reason by the definitions, and the size of the smallest unblock (None: none)."""
    resource, units = w.request
    ok = [n for n in w.nodes if _eligible(w, n) == "ok"]
    if any(_fits(w, n) for n in ok):
        return Reason.OTHER, None
    if any(_fits(w, n) for n in w.nodes if _eligible(w, n) != "ok"):
        return Reason.TIER, 1
    if resource == GPU:
        whole = [n for n in ok if isinstance(n, Whole)]

        def largest(n: Whole) -> int:
            return max(n.islands.count(i) for i in n.islands) if w.nvlink else n.gpus

        big = [n for n in whole if largest(n) >= units]
        total = sum(_whole_free(n)[0] for n in whole)
        counted = [n for n in big if _whole_free(n)[0] >= units]
        if not big or (total < units and not counted):
            return Reason.CAPACITY, None
        moves = [m for n in big if (m := _fewest_moves(w, n)) is not None]
        return Reason.CONTIGUITY_GPUS, min(moves) if moves else None
    profile = _profile(resource)
    roomy = []
    for n in ok:
        if not isinstance(n, Mig):
            continue
        geo = geometry(n.preset)
        p = geo.profile(profile)
        if p is None:
            continue
        room = sum(_gpu_room(n.preset, gpu, profile) for gpu in n.gpus)
        if room >= units:
            roomy.append(n)
    if not roomy:
        return Reason.CAPACITY, None
    costs = []
    for n in roomy:
        free = sum(1 for gpu in n.gpus for p, _, b in gpu if p == profile and not b)
        cost = _node_mig_cost(n, profile, units - free)
        if cost is not None:
            costs.append(cost)
    return Reason.CONTIGUITY_MIG, min(costs) if costs else None


# --- applying an unblock ------------------------------------------------------------------------


def apply(w: World, unblock: Unblock) -> World:
    """The world after the operator made the suggested change."""
    nodes = []
    for n in w.nodes:
        if n.name != unblock.node:
            nodes.append(n)
            continue
        if unblock.kind == "move-pods":
            assert isinstance(n, Whole)
            moved = {p.split("/", 1)[1] for p in unblock.pods}
            n = replace(n, pods=[p for p in n.pods if p[0] not in moved])
        elif unblock.kind == "heal-node":
            n = replace(n, cordoned=False)
        elif unblock.kind == "mig-layout":
            assert isinstance(n, Mig)
            gpus = [list(g) for g in n.gpus]
            for change in unblock.changes:
                old = {(p, s): b for p, s, b in gpus[change.gpu]}
                for slot in change.destroy:
                    assert not old[(slot.profile, slot.placement.start)], f"destroys busy {slot}"
                after = [(s.profile, s.placement.start) for s in change.layout]
                for key, busy in old.items():
                    if busy:
                        assert key in after, f"busy {key} not kept"
                gpus[change.gpu] = [(p, s, old.get((p, s), False)) for p, s in after]
            n = replace(n, gpus=gpus)
        nodes.append(n)
    out = replace(w, nodes=nodes)
    if unblock.kind == "admit-tier":
        out = replace(out, tolerates=True)
        if "back into service" in unblock.text:
            healed = [replace(n, cordoned=False) if n.name == unblock.node else n for n in nodes]
            out = replace(out, nodes=healed)
    return out


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(worlds())
def test_reason_and_unblock_match_the_brute_force(w: World) -> None:
    (d,) = diagnose(w.cluster().view()).diagnoses
    reason, smallest = brute(w)
    event(f"{reason.value}, unblock {'none' if smallest is None else 'some'}")
    assert d.reason is reason, (d.evidence, w)
    if reason in (Reason.OTHER, Reason.CAPACITY):
        assert d.unblock is None
        return
    if smallest is None:
        assert d.unblock is None, (d.unblock, w)
        return
    assert d.unblock is not None, (d.evidence, w)
    if reason is Reason.CONTIGUITY_GPUS:
        assert len(d.unblock.pods) == smallest, (d.unblock, w)
    if reason is Reason.CONTIGUITY_MIG:
        assert sum(len(c.destroy) for c in d.unblock.changes) == smallest, (d.unblock, w)
    after = apply(w, d.unblock)
    (again,) = diagnose(after.cluster().view()).diagnoses
    assert again.reason is Reason.OTHER, (again.evidence, d.unblock, after)


@st.composite
def fragmented(draw: st.DrawFn) -> World:
    """Whole-GPU nodes partly used, and a request above the largest free block."""
    nodes: list[Whole | Mig] = []
    for i in range(draw(st.integers(2, 3))):
        pods = _pods_on(draw, i, 8, st.integers(1, 4), largest=3)
        islands = [0] * 8 if draw(st.booleans()) else [j - j % 4 for j in range(8)]
        nodes.append(Whole(f"w{i}", 8, pods, islands))
    free = [_whole_free(n)[0] for n in nodes if isinstance(n, Whole)]
    units = draw(st.integers(min(8, max(free) + 1), 8))
    return World(nodes, (GPU, units), nvlink=draw(st.booleans()))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fragmented())
def test_fewest_pods_to_move_match_the_brute_force(w: World) -> None:
    test_reason_and_unblock_match_the_brute_force.hypothesis.inner_test(w)  # type: ignore[attr-defined]
