"""The MIG planner, asked what one more instance would cost (injected: features do not import
each other)."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from nodeagent.gpu.types import MigGeometry, MigSlot, Placement
from nodeagent_tiering.pending.capacity import ByGeometry, Slot


@dataclass(frozen=True, slots=True)
class MigPlan:
    """One GPU's plan as the diagnosis needs it (from the MIG planner's ``GpuPlan``)."""

    destroy: tuple[MigSlot, ...]
    create: tuple[MigSlot, ...]
    layout: tuple[MigSlot, ...]  # every instance afterwards, by start slice
    capacity: tuple[int, ...]  # creatable counts afterwards, largest profile first


class MigPlanner(Protocol):
    """The MIG planner: ``current`` (slot, busy) to exactly ``desired`` profile counts.

    ``None`` when no plan exists or every plan destroys a busy instance. The service, the CLI
    and the tests pass :func:`nodeagent.agent.mig_planning.plan_for_diagnosis`, which runs the
    planner ``mig apply`` runs.
    """

    def __call__(
        self,
        geometry: MigGeometry,
        current: Sequence[tuple[MigSlot, bool]],
        desired: Mapping[str, int],
    ) -> MigPlan | None:
        """Plan one GPU."""
        ...


_GAINS: ByGeometry[tuple[MigPlan | None, ...]] = ByGeometry()


def gains(
    planner: MigPlanner,
    geometry: MigGeometry,
    slots: tuple[Slot, ...],
    profile: str,
    most: int,
) -> tuple[MigPlan | None, ...]:
    """Per ``j`` in 1..``most``: the plan with the fewest destroyed instances that leaves ``j``
    more free ``profile`` instances on the GPU, keeping every held one (``None``: no such plan).

    Candidates are the current profile counts, minus some idle instances of other profiles,
    plus ``j`` of ``profile``; the planner (minimal disruption, held instances passed as busy)
    plans each, and the one destroying the fewest wins, then the one that leaves the most
    future capacity. An optimal plan never needs to recreate another profile, so the candidates
    cover every optimum; the search stops once removing more cannot destroy fewer. Cached: a
    pool has few distinct layouts, and the answer depends on nothing else.
    """
    key = (id(planner), slots, profile, most)
    found = _GAINS.get(geometry, key)
    if found is None:
        found = _GAINS.put(geometry, key, _search_gains(planner, geometry, key[1:]))
    return found


def _search_gains(
    planner: MigPlanner, geometry: MigGeometry, query: tuple[tuple[Slot, ...], str, int]
) -> tuple[MigPlan | None, ...]:
    slots, profile, most = query
    if geometry.profile(profile) is None:
        return (None,) * most
    current = [(MigSlot(s.profile, Placement(s.start, s.size)), s.held) for s in slots]
    counts = Counter(s.profile for s in slots)
    idle = Counter(s.profile for s in slots if not s.held and s.profile != profile)
    names = sorted(idle)
    removals = sorted(itertools.product(*(range(idle[n] + 1) for n in names)), key=sum)
    out: list[MigPlan | None] = []
    for j in range(1, most + 1):
        best: MigPlan | None = None
        best_key: tuple[int, tuple[int, ...]] | None = None
        for removal in removals:
            if best is not None and sum(removal) > len(best.destroy):
                break
            desired = dict(counts)
            for name, k in zip(names, removal, strict=True):
                desired[name] -= k
            desired[profile] = counts.get(profile, 0) + j
            plan = planner(geometry, current, desired)
            if plan is None:
                continue
            key = (len(plan.destroy), tuple(-v for v in plan.capacity))
            if best_key is None or key < best_key:
                best, best_key = plan, key
        out.append(best)
    return tuple(out)
