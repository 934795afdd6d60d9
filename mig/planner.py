"""The MIG planner: pure functions from a GPU model's geometry and its current instances to a plan.

Nothing here touches NVML; the applier executes the plans through :mod:`nodeagent.gpu`.

Guarantees (each is tested):

* **Exact feasibility.** If any valid placement of the desired profile multiset exists on the
  GPU, :func:`plan_gpu` finds one. The search enumerates placements exhaustively (a GPU has at
  most 8 memory slices, so the space is small), it never relies on a heuristic ordering the way
  ``nvmlDeviceCreateGpuInstance`` without a placement does.
* **Minimal disruption.** Among valid plans, the planner minimises first the number of busy
  instances destroyed (zero unless ``force``; busy: processes run on it or a workload holds
  it, see :mod:`nodeagent.holds`), then the total number destroyed. An instance the
  target still contains is kept whenever some valid plan keeps it.
* **Fragmentation-aware.** Among plans with the fewest destroys, it picks the placements that
  leave the most future capacity: the vector of :func:`creatable` counts, compared largest
  profile first. Remaining ties go to the lowest start slices, so plans are deterministic.
* **Online placement.** :func:`place_on_node` places one arriving instance on a running node
  without moving anything: on the GPU and at the placement that lose the least future capacity,
  then on the fuller GPU (the benchmark in bench/mig_churn.py measures this rule).

Capacity and fragmentation are measured by :mod:`nodeagent.capacity`, the same measures the
exporter publishes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from nodeagent.capacity import (
    Placed,
    SliceModel,
    creatable_vector,
    fits_beside,
    fragmentation_of,
    occupancy,
    placement_losses,
    slice_mask,
    slice_model,
)
from nodeagent.gpu.types import GpuInstance, MigGeometry, MigSlot, Placement
from nodeagent.holds import Holder, describe


@dataclass(frozen=True, slots=True)
class Instance:
    """An existing GPU instance as the planner sees it."""

    profile: str
    placement: Placement
    # Processes run on it, or a workload holds it (a prepared DRA claim, a device-plugin
    # allocation): destroying it would take work away. Only force destroys a busy instance.
    busy: bool = False
    instance_id: int | None = None  # the GI ID on the device, when it exists there
    uuid: str | None = None
    holders: tuple[Holder, ...] = ()  # the workloads that hold it (named in every refusal)

    @classmethod
    def of(cls, gi: GpuInstance, holders: tuple[Holder, ...] = ()) -> Instance:
        """The planner's view of a GPU instance read from the device, with its holders."""
        return cls(
            gi.profile, gi.placement, gi.busy or bool(holders), gi.instance_id, gi.uuid, holders
        )

    @property
    def slot(self) -> MigSlot:
        """Its profile and placement."""
        return MigSlot(self.profile, self.placement)

    @property
    def label(self) -> str:
        """``3g.40gb@4:4``: profile, start slice and size."""
        return self.slot.label

    @property
    def busy_label(self) -> str:
        """The label, with the workloads that hold it: ``3g.40gb@4:4 (held by DRA claim a/b)``."""
        return self.label + (f" ({describe(self.holders)})" if self.holders else "")


@dataclass(frozen=True, slots=True)
class GpuPlan:
    """What to do on one GPU: keep, destroy and create, and the layout's capacity afterwards."""

    keep: tuple[Instance, ...]
    destroy: tuple[Instance, ...]
    create: tuple[MigSlot, ...]  # new instances, at explicit placements
    creatable_after: Mapping[str, int] = field(default_factory=dict)
    fragmentation_after: float = 0.0

    @property
    def is_noop(self) -> bool:
        """The GPU already holds the target: nothing to destroy or create."""
        return not self.destroy and not self.create

    def layout_after(self) -> tuple[MigSlot, ...]:
        """Every instance on the GPU once the plan is applied, by start slice."""
        after = [i.slot for i in self.keep] + list(self.create)
        return tuple(sorted(after, key=lambda i: (i.placement.start, i.placement.size)))


class PlanError(Exception):
    """The desired layout cannot be reached; ``reason`` is one operator-facing sentence."""

    def __init__(self, reason: str, blocking: Sequence[Instance] = ()) -> None:
        super().__init__(reason)
        self.reason = reason
        self.blocking = tuple(blocking)


class InfeasibleError(PlanError):
    """No valid placement of the desired profile multiset exists on this GPU model."""


class BlockedByBusyError(PlanError):
    """Every valid plan destroys a busy instance (listed in ``blocking``) and ``force`` is off."""


# --- search --------------------------------------------------------------------------------------


def _best_completion(
    m: SliceModel, occ: int, counts: list[int], need: Sequence[int]
) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]] | None:
    """Place every profile in ``need`` (rank order) in the free slices; best capacity wins.

    Returns (capacity vector, ((profile, placement index), ...)) or ``None`` when impossible.
    Same-profile instances take placements in increasing order so that permutations of
    identical instances are not enumerated twice. The first of equally good completions in
    this order (lowest starts) is kept, which makes ties deterministic.
    """
    best: tuple[tuple[int, ...], tuple[tuple[int, int], ...]] | None = None
    chosen: list[tuple[int, int]] = []

    def dfs(k: int, occ: int, lowest: int) -> None:
        nonlocal best
        if k == len(need):
            vec = creatable_vector(m, occ, counts)
            if best is None or vec > best[0]:
                best = (vec, tuple(chosen))
            return
        p = need[k]
        masks = m.masks[p]
        for j in range(lowest, len(masks)):
            mk = masks[j]
            if mk & occ:
                continue
            chosen.append((p, j))
            counts[p] += 1
            nxt = k + 1
            dfs(nxt, occ | mk, j + 1 if nxt < len(need) and need[nxt] == p else 0)
            counts[p] -= 1
            chosen.pop()

    dfs(0, occ, 0)
    return best


def _explain_infeasible(m: SliceModel, want: Sequence[int]) -> str:
    """One sentence on why the multiset ``want`` has no valid placement on an empty GPU."""
    for p, n in enumerate(want):
        if n > m.max_count[p]:
            return f"asks for {n} x {m.names[p]}, but at most {m.max_count[p]} fit on this GPU"
    total = sum(n * m.slices[p] for p, n in enumerate(want))
    if total > m.memory_slices:
        parts = ", ".join(f"{m.names[p]} x{n} = {n * m.slices[p]}" for p, n in enumerate(want) if n)
        return f"needs {total} memory slices ({parts}), but the GPU has {m.memory_slices}"
    placed: list[int] = []
    for p, n in enumerate(want):
        for k in range(n):
            if not fits_beside(m, 0, [*placed, p]):
                starts = ",".join(str(q.start) for q in m.placements[p])
                beside = ", ".join(f"{m.names[q]} x{placed.count(q)}" for q in sorted(set(placed)))
                return (
                    f"{m.names[p]} #{k + 1} cannot be placed beside {beside}: it may start only "
                    f"at slices {starts} (size {m.slices[p]}), and every arrangement of the others "
                    "overlaps all of them"
                )
            placed.append(p)
    return "no valid placement exists"  # unreachable: the whole multiset was placed


def check_layout(geometry: MigGeometry, desired: Mapping[str, int]) -> str | None:
    """``None`` when the profile counts have a valid placement on an empty GPU, else the reason.

    Unknown profile names are reported as such, with the names the model offers.
    """
    m = slice_model(geometry)
    want = [0] * len(m.names)
    for name, n in desired.items():
        if name not in m.index:
            return f"{geometry.model} offers no profile {name!r} (it offers {', '.join(m.names)})"
        want[m.index[name]] += n
    need = [p for p, n in enumerate(want) for _ in range(n)]
    if (
        sum(n * m.slices[p] for p, n in enumerate(want)) <= m.memory_slices
        and all(n <= m.max_count[p] for p, n in enumerate(want))
        and fits_beside(m, 0, need)
    ):
        return None
    return _explain_infeasible(m, want)


def plan_gpu(
    geometry: MigGeometry,
    current: Sequence[Instance],
    desired: Mapping[str, int],
    *,
    force: bool = False,
) -> GpuPlan:
    """The plan that turns ``current`` into exactly ``desired`` profile counts on one GPU.

    Raises:
        InfeasibleError: the counts have no valid placement on this model (or name an unknown
            profile); the reason says which profile cannot fit and why.
        BlockedByBusyError: only plans that destroy busy instances exist and ``force`` is off; the
            blocking instances are listed.
    """
    problem = check_layout(geometry, {k: v for k, v in desired.items() if v})
    if problem is not None:
        raise InfeasibleError(problem)
    m = slice_model(geometry)
    want = [0] * len(m.names)
    for name, n in desired.items():
        want[m.index[name]] += n

    cur = sorted(current, key=lambda i: (i.placement.start, i.placement.size, i.profile))
    # Instances of profiles the target does not contain (or has too few of) must go; the ones
    # whose profile is wanted are candidates to keep.
    candidates = [
        i for i, c in enumerate(cur) if c.profile in m.index and want[m.index[c.profile]] > 0
    ]

    options: list[tuple[int, int, tuple[int, ...]]] = []
    for r in range(len(candidates), -1, -1):
        for keep in itertools.combinations(candidates, r):
            kept = set(keep)
            gone = [i for i in range(len(cur)) if i not in kept]
            busy = sum(1 for i in gone if cur[i].busy)
            options.append((busy, len(gone), keep))
    options.sort(key=lambda o: (o[0], o[1]))

    best_group: tuple[int, int] | None = None
    best: tuple[tuple[int, ...], tuple[int, ...], tuple[tuple[int, int], ...]] | None = None
    for busy, ndestroy, keep in options:
        if best_group is not None and (busy, ndestroy) != best_group:
            break
        counts = [0] * len(m.names)
        occ = 0
        for i in keep:
            counts[m.index[cur[i].profile]] += 1
            occ |= slice_mask(cur[i].placement)
        if any(c > w for c, w in zip(counts, want, strict=True)):
            continue
        need = [p for p in range(len(m.names)) for _ in range(want[p] - counts[p])]
        found = _best_completion(m, occ, counts, need)
        if found is None:
            continue
        if best is None or found[0] > best[0]:
            best = (found[0], keep, found[1])
        best_group = (busy, ndestroy)

    if best is None:  # pragma: no cover - check_layout proved an empty GPU works
        raise InfeasibleError(_explain_infeasible(m, want))
    vec, keep, created = best
    assert best_group is not None
    destroyed = tuple(cur[i] for i in range(len(cur)) if i not in set(keep))
    if best_group[0] > 0 and not force:
        blocking = [d for d in destroyed if d.busy]
        raise BlockedByBusyError(
            "the target needs the slices of busy instance(s) "
            + ", ".join(b.busy_label for b in blocking)
            + "; every valid layout destroys them",
            blocking,
        )
    create = tuple(MigSlot(m.names[p], m.placements[p][j]) for p, j in created)
    after_occ = 0
    for placed in [*(cur[i].placement for i in keep), *(c.placement for c in create)]:
        after_occ |= slice_mask(placed)
    return GpuPlan(
        keep=tuple(cur[i] for i in keep),
        destroy=destroyed,
        create=tuple(sorted(create, key=lambda c: (c.placement.start, c.profile))),
        creatable_after=dict(zip(m.names, vec, strict=True)),
        fragmentation_after=fragmentation_of(m, after_occ, vec),
    )


def place_on_node(
    geometry: MigGeometry, gpus: Sequence[Iterable[Placed]], profile: str
) -> tuple[int, Placement] | None:
    """Where one more ``profile`` instance should go on a node: (GPU index, placement).

    The planner's online form, for a request arriving on a running node: nothing moves, the new
    instance takes a free legal placement on one of ``gpus`` (each GPU's instances; all GPUs of
    ``geometry``'s model). The choice, in order:

    1. the placement whose GPU loses the least future capacity: the drop in :func:`capacity_key`
       counts, compared largest profile first (a 1g request goes where it does not cost a 7g);
    2. the fuller GPU (most memory slices in use), which keeps emptier GPUs whole;
    3. the lowest GPU index, then the lowest start slice, so the choice is deterministic.

    ``None`` when no GPU has a free legal placement for the profile or every GPU already holds
    its maximum count of it. Raises ValueError for a profile the model does not offer.
    """
    m = slice_model(geometry)
    p = m.index.get(profile)
    if p is None:
        raise ValueError(
            f"{geometry.model} offers no profile {profile!r} (it offers {', '.join(m.names)})"
        )
    best: tuple[tuple[tuple[int, ...], int, int, int], int, Placement] | None = None
    for g, instances in enumerate(gpus):
        occ, counts = occupancy(m, instances)
        used = occ.bit_count()
        for loss, placement in placement_losses(m, occ, counts, p):
            key = (loss, -used, g, placement.start)
            if best is None or key < best[0]:
                best = (key, g, placement)
    return None if best is None else (best[1], best[2])
