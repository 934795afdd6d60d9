"""The tier policy file (``version: v1``): tiers, their order, and the disruption budget.

Tiers are tried in the order they are listed; a node takes the first tier whose selector and
accepted stabilities match it. Loaded strictly by :mod:`nodeagent.config.loader` (unknown fields
and versions are errors naming the file and line).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from nodeagent import labels as lbl
from nodeagent.config.loader import ConfigError, load_dataclass, parse_dataclass


class Operator(enum.StrEnum):
    """Operators of a selector expression (Kubernetes names, plus numeric Gt/Lt as in affinity)."""

    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"
    GT = "Gt"
    LT = "Lt"


class Stability(enum.StrEnum):
    """What the agents say about a node (label ``nodeagent.io/stability``)."""

    STABLE = "stable"
    DEGRADED = "degraded"
    UNSTABLE = "unstable"


@dataclass(frozen=True, slots=True)
class Requirement:
    """One expression over a node label."""

    key: str
    operator: Operator
    values: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        needs = {Operator.IN: "some", Operator.NOT_IN: "some", Operator.GT: "one"}
        needs[Operator.LT] = "one"
        if self.operator in (Operator.EXISTS, Operator.DOES_NOT_EXIST) and self.values:
            raise ValueError(f"{self.key}: {self.operator} takes no values")
        if needs.get(self.operator) == "some" and not self.values:
            raise ValueError(f"{self.key}: {self.operator} needs at least one value")
        one = needs.get(self.operator) == "one"
        if one and (len(self.values) != 1 or not _is_number(self.values[0])):
            raise ValueError(f"{self.key}: {self.operator} needs exactly one number")

    def matches(self, labels: dict[str, str]) -> bool:
        """Whether the labels satisfy this expression."""
        value = labels.get(self.key)
        op = self.operator
        if op is Operator.IN:
            return value in self.values
        if op is Operator.NOT_IN:
            return value not in self.values
        if op is Operator.EXISTS:
            return value is not None
        if op is Operator.DOES_NOT_EXIST:
            return value is None
        if value is None or not _is_number(value):
            return False
        bound = float(self.values[0])
        return float(value) > bound if op is Operator.GT else float(value) < bound


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class Selector:
    """Labels a node must carry (all of them)."""

    match_labels: dict[str, str] = field(default_factory=dict)
    match_expressions: tuple[Requirement, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        """Whether every label and expression matches."""
        for key, value in self.match_labels.items():
            if labels.get(key) != value:
                return False
        return all(req.matches(labels) for req in self.match_expressions)


def _check_quantity(name: str, value: int | str) -> None:
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{name} must not be negative, got {value}")
        return
    if not value.endswith("%") or not _is_number(value[:-1]) or not 0 <= float(value[:-1]) <= 100:
        raise ValueError(f"{name} must be a count or a percentage like '10%', got {value!r}")


def resolve(value: int | str, total: int, *, round_up: bool) -> int:
    """A count or a percentage of ``total`` as a node count."""
    if isinstance(value, int):
        return value
    share = float(value[:-1]) * total / 100
    return math.ceil(share) if round_up else math.floor(share)


@dataclass(frozen=True, slots=True)
class Tier:
    """One tier: which nodes qualify, and how much of it may be out of service."""

    name: str
    selector: Selector = field(default_factory=Selector)
    stability: tuple[Stability, ...] = (Stability.STABLE, Stability.DEGRADED)  # accepted health
    expected_driver_version: str | None = None  # nodes on another driver do not qualify
    min_healthy: int | str = 0  # nodes (or % of the tier) that must stay in service
    max_draining: int | str = 1  # drains at once in this tier (a % rounds down, at least 1)

    def __post_init__(self) -> None:
        if not self.name or self.name != self.name.strip() or len(self.name) > 63:
            raise ValueError(f"tier name {self.name!r} must be a valid label value")
        _check_quantity(f"tier {self.name}: min_healthy", self.min_healthy)
        _check_quantity(f"tier {self.name}: max_draining", self.max_draining)


@dataclass(frozen=True, slots=True)
class BudgetPolicy:
    """Cluster-wide limits on disruption."""

    max_draining: int | str = 1  # drains at once across the cluster (count or %)
    cooldown_s: float = 600.0  # seconds between starting two drains (draino's drain buffer)

    def __post_init__(self) -> None:
        _check_quantity("budget.max_draining", self.max_draining)
        if self.cooldown_s < 0:
            raise ValueError(f"budget.cooldown_s must not be negative, got {self.cooldown_s}")


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    """Stop every drain when too many nodes turn unstable at once (NVSentinel: 50% in 5 min)."""

    percentage: float = 50.0  # trips when more than this % of nodes turned unstable in the window
    window_s: float = 300.0  # sliding window, seconds
    min_unstable: int = 2  # and at least this many nodes (one bad node is never a storm)

    def __post_init__(self) -> None:
        if not 0 < self.percentage <= 100:
            raise ValueError(f"breaker.percentage must be in (0, 100], got {self.percentage}")
        if self.window_s <= 0:
            raise ValueError(f"breaker.window_s must be positive, got {self.window_s}")


@dataclass(frozen=True, slots=True)
class DrainPolicy:
    """How a drain evicts pods."""

    max_grace_period_s: int = 480  # eviction grace = min(pod's own, this) (draino: 8 min)
    timeout_s: float = 3600.0  # a drain with pods left after this is marked failed
    pdb_backoff_initial_s: float = 5.0  # first retry after a 429 (PDB); doubles per refusal
    pdb_backoff_max_s: float = 120.0  # retry interval cap (NVSentinel: 10 s doubling to 2 min)
    taint_key: str = lbl.QUARANTINE_TAINT
    taint_effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"

    def __post_init__(self) -> None:
        if self.max_grace_period_s < 0:
            raise ValueError("drain.max_grace_period_s must not be negative")
        if self.pdb_backoff_initial_s <= 0 or self.pdb_backoff_max_s < self.pdb_backoff_initial_s:
            raise ValueError("drain.pdb_backoff_initial_s must be > 0 and <= pdb_backoff_max_s")


@dataclass(frozen=True, slots=True)
class PendingPolicy:
    """How the pending-workload diagnosis reads workloads (optional section, added in v1)."""

    # Pod label or annotation by which a workload asks for GPU topology: value "nvlink" (one
    # NVLink-connected set) or "numa" (one NUMA node). Without it only the count matters,
    # which is all kube-scheduler checks for extended resources.
    topology_key: str = lbl.GPU_TOPOLOGY

    def __post_init__(self) -> None:
        if not self.topology_key.strip():
            raise ValueError("pending.topology_key must name a label or annotation key")


def _gpu_nodes() -> Selector:
    return Selector(match_expressions=(Requirement(lbl.STABILITY, Operator.EXISTS),))


@dataclass(frozen=True, slots=True)
class TierPolicy:
    """The whole policy file."""

    tiers: tuple[Tier, ...]
    nodes: Selector = field(default_factory=_gpu_nodes)  # which nodes the service manages
    quarantine_tier: str = "quarantine"  # tier label of nodes taken out of service
    recovery_period_s: float = 600.0  # a node must stay stable this long before it returns
    budget: BudgetPolicy = field(default_factory=BudgetPolicy)
    breaker: BreakerPolicy = field(default_factory=BreakerPolicy)
    drain: DrainPolicy = field(default_factory=DrainPolicy)
    pending: PendingPolicy = field(default_factory=PendingPolicy)
    resync_s: float = 30.0  # full reconcile at least this often, even without changes

    def __post_init__(self) -> None:
        if not self.tiers:
            raise ValueError("tiers: list at least one tier")
        names = [t.name for t in self.tiers]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"tiers: duplicate tier names {', '.join(duplicates)}")
        if self.quarantine_tier in names:
            raise ValueError(
                f"quarantine_tier {self.quarantine_tier!r} is also a listed tier; pick another"
            )
        if self.recovery_period_s < 0:
            raise ValueError("recovery_period_s must not be negative")

    def tier(self, name: str) -> Tier | None:
        """The tier with this name."""
        return next((t for t in self.tiers if t.name == name), None)


def load_policy(path: Path) -> TierPolicy:
    """Load and validate a tier policy file; raises ConfigError naming file, line and field."""
    return load_dataclass(TierPolicy, path)


def parse_policy(data: Any, source: str = "<policy>") -> TierPolicy:
    """Validate an already parsed policy mapping."""
    return parse_dataclass(TierPolicy, data, source=source)


__all__ = [
    "BreakerPolicy",
    "BudgetPolicy",
    "ConfigError",
    "DrainPolicy",
    "Operator",
    "PendingPolicy",
    "Requirement",
    "Selector",
    "Stability",
    "Tier",
    "TierPolicy",
    "load_policy",
    "parse_policy",
    "resolve",
]
