"""The tier policy file (``version: v1``): tiers, their order, and the disruption budget.

Tiers are tried in the order they are listed; a node takes the first tier whose selector and
accepted stabilities match it. Loaded strictly by :mod:`nodeagent.config.loader` (unknown fields
and versions are errors naming the file and line; every problem is reported at once).
"""

from __future__ import annotations

import enum
import math
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import BeforeValidator, Field, model_validator

from nodeagent import labels as lbl
from nodeagent.config.errors import ConfigError, FieldError
from nodeagent.config.loader import Schema, load_file, validate_document
from nodeagent.config.types import LabelKey, Labels, LabelValue, any_label_value
from nodeagent.config.yamlfile import Document

KIND = "a tier policy"
DAY_S = 86400.0
MAX_NODES = 100_000  # a count of nodes above any cluster Kubernetes supports (5,000 nodes)


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


class Requirement(Schema):
    """One expression over a node label."""

    key: LabelKey = Field(description="the label")
    operator: Operator
    values: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _values_fit_the_operator(self) -> Self:
        found = FieldError()
        if self.operator in (Operator.EXISTS, Operator.DOES_NOT_EXIST) and self.values:
            found.add("values", f"{self.key}: {self.operator} takes no values")
        if self.operator in (Operator.IN, Operator.NOT_IN) and not self.values:
            found.add("values", f"{self.key}: {self.operator} needs at least one value")
        if self.operator in (Operator.IN, Operator.NOT_IN):
            for index, value in enumerate(self.values):
                try:
                    any_label_value(value)  # a value no label can hold would never match
                except ValueError as exc:
                    found.add(("values", index), str(exc))
        if self.operator in (Operator.GT, Operator.LT) and (
            len(self.values) != 1 or not _is_number(self.values[0])
        ):
            found.add("values", f"{self.key}: {self.operator} needs exactly one number")
        found.raise_any()
        return self

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
        return math.isfinite(float(text))
    except ValueError:
        return False


class Selector(Schema):
    """Labels a node must carry (all of them)."""

    match_labels: Labels = Field(default_factory=dict, description="label: value")
    match_expressions: tuple[Requirement, ...] = Field(
        (), description="key, operator (In, NotIn, Exists, DoesNotExist, Gt, Lt), values"
    )

    def matches(self, labels: dict[str, str]) -> bool:
        """Whether every label and expression matches."""
        for key, value in self.match_labels.items():
            if labels.get(key) != value:
                return False
        return all(req.matches(labels) for req in self.match_expressions)


def _quantity(value: Any) -> int | str:
    """A node count (0..MAX_NODES) or a percentage of the nodes (``"10%"``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value <= MAX_NODES:
            raise ValueError(f"a count of nodes must be 0..{MAX_NODES}, got {value}")
        return value
    if (
        isinstance(value, str)
        and value.endswith("%")
        and _is_number(value[:-1])
        and 0 <= float(value[:-1]) <= 100
    ):
        return value
    raise ValueError(f"must be a count or a percentage like '10%', got {value!r}")


Quantity = Annotated[int | str, BeforeValidator(_quantity)]


def resolve(value: int | str, total: int, *, round_up: bool) -> int:
    """A count or a percentage of ``total`` as a node count."""
    if isinstance(value, int):
        return value
    share = float(value[:-1]) * total / 100
    return math.ceil(share) if round_up else math.floor(share)


class Tier(Schema):
    """One tier: which nodes qualify, and how much of it may be out of service."""

    name: LabelValue = Field(description="the tier, as the value of the tier label")
    selector: Selector = Field(default_factory=Selector, description="labels a node must carry")
    stability: tuple[Stability, ...] = Field(
        (Stability.STABLE, Stability.DEGRADED), min_length=1, description="accepted health"
    )
    expected_driver_version: str | None = Field(
        None, min_length=1, description="nodes on another driver do not qualify"
    )
    min_healthy: Quantity = Field(
        0, description="nodes (or % of the tier) that must stay in service"
    )
    max_draining: Quantity = Field(
        1, description="drains at once in this tier (a % rounds down, at least 1)"
    )


class BudgetPolicy(Schema):
    """Cluster-wide limits on disruption."""

    max_draining: Quantity = Field(1, description="drains at once across the cluster (count or %)")
    cooldown_s: float = Field(
        600.0,
        ge=0,
        le=DAY_S,
        description="seconds between starting two drains (draino's drain buffer)",
    )


class BreakerPolicy(Schema):
    """Stop every drain when too many nodes turn unstable at once (NVSentinel: 50% in 5 min)."""

    percentage: float = Field(
        50.0,
        gt=0,
        le=100,
        description="trips when more than this % of nodes turned unstable in the window",
    )
    window_s: float = Field(300.0, ge=1, le=DAY_S, description="sliding window, seconds")
    min_unstable: int = Field(
        2,
        ge=1,
        le=MAX_NODES,
        description="and at least this many nodes (one bad node is never a storm)",
    )


class DrainPolicy(Schema):
    """How a drain evicts pods."""

    ordered = (("pdb_backoff_initial_s", "pdb_backoff_max_s"),)

    max_grace_period_s: int = Field(
        480,
        ge=0,
        le=int(DAY_S),
        description="eviction grace = min(pod's own, this) (draino: 8 min)",
    )
    timeout_s: float = Field(
        3600.0, ge=1, le=7 * DAY_S, description="a drain with pods left after this is marked failed"
    )
    pdb_backoff_initial_s: float = Field(
        5.0, ge=0.1, le=3600, description="first retry after a 429 (PDB); doubles per refusal"
    )
    pdb_backoff_max_s: float = Field(
        120.0,
        ge=0.1,
        le=3600,
        description="retry interval cap (NVSentinel: 10 s doubling to 2 min)",
    )
    taint_key: LabelKey = Field(
        lbl.QUARANTINE_TAINT, description="taint put on a node being drained"
    )
    taint_effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"


class PendingPolicy(Schema):
    """How the pending-workload diagnosis reads workloads (optional section, added in v1)."""

    # Without a topology request only the count matters, which is all kube-scheduler checks
    # for extended resources.
    topology_key: LabelKey = Field(
        lbl.GPU_TOPOLOGY,
        description='pod label or annotation asking for GPU topology: "nvlink" or "numa"',
    )


def _gpu_nodes() -> Selector:
    return Selector(match_expressions=(Requirement(key=lbl.STABILITY, operator=Operator.EXISTS),))


class GpuRemediationPolicy(Schema):
    """Remediation of one GPU: evict only its pods instead of draining the node (off by default)."""

    enabled: bool = Field(
        False, description="evict the pods of a GPU published unhealthy on an otherwise fine node"
    )
    max_gpus: int = Field(
        1,
        ge=1,
        le=16,
        description="a node with more faulty GPUs than this is drained as a whole instead",
    )


class TierPolicy(Schema):
    """The whole policy file."""

    tiers: tuple[Tier, ...] = Field(min_length=1, description="in order; a node takes the first")
    nodes: Selector = Field(
        default_factory=_gpu_nodes, description="which nodes the service manages"
    )
    quarantine_tier: LabelValue = Field(
        "quarantine", description="tier label of nodes taken out of service"
    )
    recovery_period_s: float = Field(
        600.0,
        ge=0,
        le=7 * DAY_S,
        description="a node must stay stable this long before it returns",
    )
    budget: BudgetPolicy = Field(default_factory=BudgetPolicy)
    breaker: BreakerPolicy = Field(default_factory=BreakerPolicy)
    drain: DrainPolicy = Field(default_factory=DrainPolicy)
    gpu_remediation: GpuRemediationPolicy = Field(default_factory=GpuRemediationPolicy)
    pending: PendingPolicy = Field(default_factory=PendingPolicy)
    # The floor keeps the service's API traffic low: changes trigger a pass anyway.
    resync_s: float = Field(
        30.0, ge=1, le=3600, description="full reconcile at least this often, even without changes"
    )

    @model_validator(mode="after")
    def _names_unique(self) -> Self:
        found = FieldError()
        seen: dict[str, int] = {}
        for i, tier in enumerate(self.tiers):
            if tier.name in seen:
                found.add(("tiers", i, "name"), f"tier {tier.name!r} is listed twice")
            seen.setdefault(tier.name, i)
        if self.quarantine_tier in seen:
            found.add(
                "quarantine_tier",
                f"{self.quarantine_tier!r} is also a listed tier; pick another",
            )
        found.raise_any()
        return self

    def tier(self, name: str) -> Tier | None:
        """The tier with this name."""
        return next((t for t in self.tiers if t.name == name), None)


def load_policy(path: Path) -> TierPolicy:
    """Load and validate a tier policy file.

    Raises:
        ConfigError: every problem at once, naming file, line and field.
    """
    return load_file(TierPolicy, path, kind=KIND)


def parse_policy(data: Any, source: str = "<policy>") -> TierPolicy:
    """Validate an already parsed policy mapping (raises ConfigError)."""
    return validate_document(TierPolicy, Document(source, data), kind=KIND)


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
