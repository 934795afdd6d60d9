"""The MIG planner as the tiering service's diagnosis takes it (features do not import each
other, so the composition layer hands it over).

:func:`plan_for_diagnosis` runs :func:`nodeagent_mig.planner.plan_gpu`, the minimal-disruption
planner ``nodeagent mig apply`` runs, and reduces its plan to what the diagnosis reports.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from nodeagent.gpu.types import MigGeometry, MigSlot
from nodeagent_mig.planner import Instance, PlanError, plan_gpu
from nodeagent_tiering.pending.mig import MigPlan


def plan_for_diagnosis(
    geometry: MigGeometry, current: Sequence[tuple[MigSlot, bool]], desired: Mapping[str, int]
) -> MigPlan | None:
    """The plan to exactly ``desired``, never destroying a busy instance; ``None``: none."""
    instances = [Instance(slot.profile, slot.placement, busy=busy) for slot, busy in current]
    try:
        plan = plan_gpu(geometry, instances, desired)
    except PlanError:
        return None
    return MigPlan(
        destroy=tuple(i.slot for i in plan.destroy),
        create=tuple(plan.create),
        layout=plan.layout_after(),
        capacity=tuple(plan.creatable_after.values()),
    )
