"""Churn: online MIG requests and releases on 8-GPU nodes under three placement policies.

    python bench/mig_churn.py [--seeds 2] [--events 6000] [--loads 0.6,0.9,1.2,1.5]

Requests for MIG instances arrive (Poisson) and leave (exponential holding time, mean 10) on a
node of 8 GPUs of one model; requests favour small profiles (weight 1/size). A request is
served

1. *in place* when some GPU has a free legal placement for it: no running instance is touched.
   The policy picks the GPU and the placement;
2. else *by reconfiguring* one GPU that can hold its instances plus the new one. nodeagent plans
   it with its minimal-disruption planner (``nodeagent_mig.planner.plan_gpu``: every instance
   that some valid layout can keep stays, only the rest move) on the GPU where the fewest
   instances move.
   The baselines do what mig-parted does: clear the GPU and create everything again with their
   own placement rule, largest first, trying orderings until one fits; they reconfigure the GPU
   with the fewest instances, so a wipe disturbs as little as it can. Every instance moved is a
   disturbed running instance;
3. else it is rejected: no GPU has room for it in any layout.

Policies: nodeagent (``nodeagent_mig.planner.place_on_node``: the placement whose GPU loses the
least future capacity, largest profiles first, then the fuller GPU), lowest-free-slot first-fit, and
the driver-default heuristic the simulator implements for ``nvmlDeviceCreateGpuInstance``
without a placement (``nodeagent.sim.ops.default_start``: the upper half of the memory slices
fills first, the profile's last legal start there, then its other starts there from the bottom
up, then the lower half from the bottom up; on the 8-slice parts 1g 6, 4, 5, 0, 1, 2, 3, 2g 4,
0, 2 and 3g 4, 0), both on the lowest-numbered GPU where the profile fits.

Reported per trace: the share of served requests served without disturbing running instances
(in place), instances disturbed, the share rejected, and the mean fragmentation ratio over GPUs
and time (docs/mig.md). Then the fragmentation over time: the node's mean fragmentation ratio
sampled at each request, as p50/p90/p99/max per policy, pooled over models and seeds, per
offered load and overall.
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

sys.path.insert(0, __file__.rsplit("/", 1)[0])

from mig_common import geometries

from nodeagent.capacity import capacity_key, fragmentation_ratio, memory_slices_of
from nodeagent.gpu.types import MigGeometry, MigSlot, Placement
from nodeagent.sim.ops import default_start
from nodeagent_mig.planner import Instance, check_layout, place_on_node, plan_gpu

GPUS = 8
HOLD = 10.0  # mean holding time of an instance
MAX_ORDERINGS = 200  # orderings a wipe-and-recreate tries before giving up (mig-parted: all)
Gpu = list[MigSlot]
Rule = Callable[[MigGeometry, list[Gpu], str], tuple[int, Placement] | None]


def _free(gpu: Gpu, pl: Placement) -> bool:
    return not any(pl.overlaps(i.placement) for i in gpu)


def _room(geometry: MigGeometry, gpu: Gpu, profile: str) -> list[Placement]:
    prof = geometry.profile(profile)
    assert prof is not None
    if sum(1 for i in gpu if i.profile == profile) >= prof.max_count:
        return []
    return [pl for pl in sorted(prof.placements, key=lambda p: p.start) if _free(gpu, pl)]


def first_fit(geometry: MigGeometry, node: list[Gpu], profile: str) -> tuple[int, Placement] | None:
    """The lowest free legal placement on the lowest-numbered GPU where the profile fits."""
    for g, gpu in enumerate(node):
        room = _room(geometry, gpu, profile)
        if room:
            return g, room[0]
    return None


def driver_default(
    geometry: MigGeometry, node: list[Gpu], profile: str
) -> tuple[int, Placement] | None:
    """The simulator's model of ``nvmlDeviceCreateGpuInstance`` without a placement
    (``nodeagent.sim.ops.default_start``) on the lowest-numbered GPU where the profile fits."""
    prof = geometry.profile(profile)
    assert prof is not None
    starts = [pl.start for pl in prof.placements]
    for g, gpu in enumerate(node):
        if not _room(geometry, gpu, profile):
            continue
        taken = [(i.placement.start, i.placement.size) for i in gpu]
        start = default_start(starts, memory_slices_of(prof), taken, geometry.memory_slices)
        assert start is not None  # _room found a free legal placement
        return g, next(pl for pl in prof.placements if pl.start == start)
    return None


RULES: dict[str, Rule] = {
    "nodeagent": place_on_node,
    "first-fit": first_fit,
    "driver-default": driver_default,
}


def _wipe_and_recreate(geometry: MigGeometry, profiles: Sequence[str], rule: Rule) -> Gpu | None:
    """mig-parted's apply on one GPU: clear it, create largest first, permute on failure."""
    order = sorted(profiles, key=lambda p: (-memory_slices_of(geometry.profile(p)), p))  # type: ignore[arg-type]
    tried: set[tuple[str, ...]] = set()
    for perm in itertools.permutations(order):
        if perm in tried:
            continue
        tried.add(perm)
        gpu: Gpu = []
        for profile in perm:
            spot = rule(geometry, [gpu], profile)
            if spot is None:
                break
            gpu.append(MigSlot(profile, spot[1]))
        else:
            return gpu
        if len(tried) >= MAX_ORDERINGS:
            break
    return None


@dataclass
class Reconfiguration:
    gpu: int
    layout: Gpu  # every instance on the GPU afterwards, the new one included
    kept: set[tuple[str, int]]  # (profile, start) of instances that did not move
    moved: int  # running instances disturbed


def _reconfigure(
    geometry: MigGeometry, node: list[Gpu], profile: str, policy: str
) -> Reconfiguration | None:
    best: tuple[tuple[object, ...], Reconfiguration] | None = None
    for g, gpu in enumerate(node):
        want = Counter(i.profile for i in gpu)
        want[profile] += 1
        if check_layout(geometry, dict(want)) is not None:
            continue
        if policy == "nodeagent":
            current = [Instance(i.profile, i.placement, busy=True) for i in gpu]
            plan = plan_gpu(geometry, current, dict(want), force=True)
            layout = list(plan.layout_after())
            kept = {(i.profile, i.placement.start) for i in plan.keep}
            option = Reconfiguration(g, layout, kept, len(plan.destroy))
            capacity = capacity_key(geometry, layout)
            key: tuple[object, ...] = (option.moved, tuple(-c for c in capacity), g)
        else:
            wiped = _wipe_and_recreate(geometry, list(want.elements()), RULES[policy])
            if wiped is None:
                continue
            option = Reconfiguration(g, wiped, set(), len(gpu))
            key = (option.moved, g)
        if best is None or key < best[0]:
            best = (key, option)
    return None if best is None else best[1]


@dataclass
class Event:
    time: float
    kind: str  # "arrive" | "leave"
    job: int
    profile: str


def trace(geometry: MigGeometry, load: float, events: int, seed: int) -> list[Event]:
    """Poisson arrivals, exponential holding times; offered load relative to node capacity."""
    rng = random.Random(seed)
    profiles = [p for p in geometry.profiles if "+" not in p.name]
    weights = [1.0 / memory_slices_of(p) for p in profiles]
    mean_slices = sum(w * memory_slices_of(p) for w, p in zip(weights, profiles, strict=True))
    mean_slices /= sum(weights)
    rate = load * GPUS * geometry.memory_slices / (mean_slices * HOLD)
    out: list[Event] = []
    t = 0.0
    for job in range(events):
        t += rng.expovariate(rate)
        p = rng.choices(profiles, weights)[0].name
        out.append(Event(t, "arrive", job, p))
        out.append(Event(t + rng.expovariate(1 / HOLD), "leave", job, p))
    out.sort(key=lambda e: (e.time, e.kind == "arrive"))
    return out


@dataclass
class Occupancy:
    """The instances on a node of ``GPUS`` GPUs, and which GPU and instance each job holds."""

    node: list[Gpu] = field(default_factory=lambda: [[] for _ in range(GPUS)])
    where: dict[int, tuple[int, MigSlot]] = field(default_factory=dict)

    def place(self, job: int, gpu: int, inst: MigSlot) -> None:
        self.node[gpu].append(inst)
        self.where[job] = (gpu, inst)

    def leave(self, job: int) -> None:
        """Free the job's instance; a job that was rejected holds none."""
        if job in self.where:
            g, inst = self.where.pop(job)
            self.node[g].remove(inst)


@dataclass
class Outcome:
    in_place_share: float  # served in place / served
    disturbed: int  # running instances moved by reconfigurations
    rejected_share: float
    fragmentation: float  # mean of ``over_time``
    over_time: list[float]  # the node's mean fragmentation ratio at each request


def run(geometry: MigGeometry, events: list[Event], policy: str) -> Outcome:
    occupancy = Occupancy()
    node, where = occupancy.node, occupancy.where
    in_place = reconfigured = rejected = disturbed = 0
    frag: list[float] = []
    for e in events:
        if e.kind == "leave":
            occupancy.leave(e.job)
            continue
        spot = RULES[policy](geometry, node, e.profile)
        if spot is not None:
            occupancy.place(e.job, spot[0], MigSlot(e.profile, spot[1]))
            in_place += 1
        else:
            change = _reconfigure(geometry, node, e.profile, policy)
            if change is None:
                rejected += 1
            else:
                reconfigured += 1
                disturbed += change.moved
                fresh = [
                    i for i in change.layout if (i.profile, i.placement.start) not in change.kept
                ]
                for job, (g, inst) in list(where.items()):
                    if g != change.gpu or (inst.profile, inst.placement.start) in change.kept:
                        continue
                    moved_to = next(i for i in fresh if i.profile == inst.profile)
                    fresh.remove(moved_to)
                    where[job] = (g, moved_to)
                mine = next(i for i in fresh if i.profile == e.profile)
                node[change.gpu] = list(change.layout)
                where[e.job] = (change.gpu, mine)
        frag.append(statistics.fmean(fragmentation_ratio(geometry, g) for g in node))
    asked = in_place + reconfigured + rejected
    return Outcome(
        in_place / max(in_place + reconfigured, 1),
        disturbed,
        rejected / max(asked, 1),
        statistics.fmean(frag),
        frag,
    )


def _quantiles(samples: Sequence[float], qs: Sequence[float]) -> list[float]:
    """Nearest-rank quantiles of ``samples`` (q = 1.0 is the maximum)."""
    ordered = sorted(samples)
    return [ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))] for q in qs]


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--events", type=int, default=6000)
    ap.add_argument("--loads", default="0.6,0.9,1.2,1.5")
    args = ap.parse_args()
    loads = [float(x) for x in args.loads.split(",")]
    names = list(RULES)
    print(
        f"{'model':<11} {'load':>4} {'seed':>4} | in place: {'nodeagent':>9} {'first-fit':>9} "
        f"{'driver':>7} | disturbed: {'na':>4} {'ff':>4} {'drv':>4} | rejected: {'na':>5} "
        f"{'ff':>5} {'drv':>5} | frag: {'na':>5} {'ff':>5} {'drv':>5}"
    )
    worse = traces = 0
    share: dict[str, list[float]] = {n: [] for n in names}
    moved: dict[str, int] = dict.fromkeys(names, 0)
    frag: dict[str, list[float]] = {n: [] for n in names}
    # Every request's node-mean fragmentation, pooled over models and seeds: per load and overall.
    over_time: dict[tuple[str, float | None], list[float]] = {}
    for m, (label, geometry) in enumerate(geometries().items()):
        for load in loads:
            for seed in range(args.seeds):
                events = trace(geometry, load, args.events, 1000 * m + seed)
                res = {n: run(geometry, events, n) for n in names}
                baseline = max(
                    res["first-fit"].in_place_share, res["driver-default"].in_place_share
                )
                lost = res["nodeagent"].in_place_share + 1e-12 < baseline
                worse += lost
                traces += 1
                for n in names:
                    share[n].append(res[n].in_place_share)
                    moved[n] += res[n].disturbed
                    frag[n].append(res[n].fragmentation)
                    over_time.setdefault((n, load), []).extend(res[n].over_time)
                    over_time.setdefault((n, None), []).extend(res[n].over_time)
                r = [res[n] for n in names]
                print(
                    f"{label:<11} {load:>4.1f} {seed:>4} | {'':>9} "
                    + " ".join(f"{o.in_place_share:>9.4f}" for o in r[:2])
                    + f" {r[2].in_place_share:>7.4f} | {'':>10} "
                    + " ".join(f"{o.disturbed:>4}" for o in r)
                    + f" | {'':>9} "
                    + " ".join(f"{o.rejected_share:>5.3f}" for o in r)
                    + f" | {'':>5} "
                    + " ".join(f"{o.fragmentation:>5.3f}" for o in r)
                    + ("  <- nodeagent below a baseline" if lost else "")
                )
    print()
    print(
        f"traces: {traces}; traces where nodeagent served fewer in place than a baseline: {worse}"
    )
    for n in names:
        print(
            f"{n:<15} mean in-place share {statistics.fmean(share[n]):.4f}  "
            f"instances disturbed {moved[n]:>6}  mean fragmentation {statistics.fmean(frag[n]):.3f}"
        )
    for base in ("first-fit", "driver-default"):
        ratio = moved[base] / max(moved["nodeagent"], 1)
        print(f"nodeagent disturbs {ratio:.1f}x fewer running instances than {base}")
    print()
    print(
        "fragmentation over time: the node's mean fragmentation ratio at each request, "
        "pooled over models and seeds"
    )
    print(
        f"{'load':<5} | "
        + " | ".join(f"{n:<14} {'p50':>5} {'p90':>5} {'p99':>5} {'max':>5}" for n in names)
    )
    rows: list[float | None] = [*loads, None]
    for row in rows:
        cells = []
        for n in names:
            q = _quantiles(over_time[n, row], (0.5, 0.9, 0.99, 1.0))
            cells.append(f"{'':<14} " + " ".join(f"{v:>5.3f}" for v in q))
        print(f"{'all' if row is None else f'{row:.1f}':<5} | " + " | ".join(cells))


if __name__ == "__main__":
    main()
