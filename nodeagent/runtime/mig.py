"""What other features see of the MIG reconciler: the outcome of its last round.

CONTRACT FILE: the exporter reads these names (``nodeagent_mig_layout_applied``,
``nodeagent_mig_apply_outcome``, ``nodeagent_mig_unrestored_instances``); the MIG feature
fills them in.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MigGpuOutcome:
    """What the last apply did on one GPU."""

    gpu: int
    outcome: str  # applied, unchanged, reset-required, blocked-busy, failed, lost
    reason: str  # why it does not hold the layout, one short sentence ("" when it does)
    unrestored: int  # instances the apply destroyed and could not recreate


@dataclass(frozen=True, slots=True)
class MigLayoutStatus:
    """The pool's MIG layout and whether the node holds it."""

    layout: str
    applied: bool
    reason: str  # why not ("" when applied): the first GPU's problem, a bad file, the lock
    gpus: tuple[MigGpuOutcome, ...]  # from the last apply that ran (empty before one ran)
