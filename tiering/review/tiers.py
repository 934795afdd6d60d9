"""The pool review: per tier, nodes and GPUs, health, driver drift, MIG layouts, fragmentation,
stranded capacity, and drains with their causes over a period.

Inputs are what the agents and the service publish on the API server (labels, annotations,
Events). Fragmentation and stranded capacity come from a Prometheus query API when one is given
(the exporter's ``nodeagent_mig_fragmentation_ratio``, ``nodeagent_stranded_mig_slices`` and
``nodeagent_stranded_gpus``, grouped by the target label that names the node), else from node
annotations the agents publish. Output: a table, JSON, or a self-contained HTML page.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from nodeagent import labels as lbl
from nodeagent_tiering.cluster.nodes import Node, node_state
from nodeagent_tiering.cluster.tier_policy import Stability, TierPolicy
from nodeagent_tiering.cluster.units import parse_time
from nodeagent_tiering.review.sections import ReviewSection

MIG_CONFIG_LABEL = lbl.MIG_CONFIG  # mig-manager's label naming the node's layout

TIER_IN_MESSAGE = re.compile(r"\(tier ([^)]+)\)")


@dataclass
class TierReview:
    """The review of one tier."""

    tier: str
    nodes: int = 0
    gpus: int = 0
    healthy: int = 0
    degraded: int = 0
    unstable: int = 0
    quarantined: int = 0
    drivers: dict[str, int] = field(default_factory=dict)
    expected_driver: str | None = None
    driver_drift: int = 0  # nodes not on the expected (or, without one, the most common) driver
    mig_layouts: dict[str, int] = field(default_factory=dict)
    fragmentation_ratio: float | None = None  # mean over nodes that report it
    stranded_mig_slices: float | None = None
    stranded_gpus: float | None = None
    drains: int = 0
    drain_causes: dict[str, int] = field(default_factory=dict)


@dataclass
class Review:
    """The whole review."""

    period_s: float
    source: str  # "prometheus" or "annotations"
    tiers: list[TierReview]
    sections: list[ReviewSection] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """Plain data for ``--json``."""
        data: dict[str, Any] = {
            "period_seconds": self.period_s,
            "capacity_source": self.source,
            "tiers": [asdict(t) for t in self.tiers],
        }
        for section in self.sections:
            data[section.key] = section.to_json()
        return data


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def cause_key(message: str) -> str:
    """A short, countable cause from a DrainStarted message."""
    text = message.split(":", 1)[1].strip() if ":" in message else message
    match = re.match(r"GPUHealthy=False \(([^)]*)\)", text)
    if match:
        return match.group(1) or "GPUHealthy=False"
    return text.split(":")[0][:60] or "unknown"


def build_review(
    nodes: Sequence[Node],
    events: Iterable[Mapping[str, Any]],
    *,
    policy: TierPolicy | None,
    now_s: float,
    period_s: float,
    prometheus: Mapping[str, Mapping[str, float]] | None = None,
) -> Review:
    """Build the review from node views, node Events and optional Prometheus values."""
    reviews: dict[str, TierReview] = {}
    order = [t.name for t in policy.tiers] + [policy.quarantine_tier] if policy else []
    for name in order:
        reviews[name] = TierReview(name)
    frag: dict[str, list[float]] = {}
    slices: dict[str, list[float]] = {}
    stranded: dict[str, list[float]] = {}
    for n in nodes:
        if lbl.STABILITY not in n.labels and lbl.TIER not in n.labels and n.drain is None:
            continue  # not a GPU node the agents or the service know
        name = n.labels.get(lbl.TIER, "(none)")
        r = reviews.setdefault(name, TierReview(name))
        r.nodes += 1
        r.gpus += n.gpus
        # The metric's definition (nodeagent_tiering_nodes), so the two always agree.
        state = node_state(n, policy)
        if n.drain is not None:
            r.quarantined += 1
        elif state == Stability.UNSTABLE.value:
            r.unstable += 1
        elif state == Stability.DEGRADED.value:
            r.degraded += 1
        else:
            r.healthy += 1
        driver = n.labels.get(lbl.DRIVER_VERSION, "unknown")
        r.drivers[driver] = r.drivers.get(driver, 0) + 1
        # nodeagent's own label first; mig-manager's for nodes it configures.
        layout = n.labels.get(lbl.MIG_LAYOUT) or n.labels.get(MIG_CONFIG_LABEL, "none")
        r.mig_layouts[layout] = r.mig_layouts.get(layout, 0) + 1
        if prometheus is not None:
            values = [
                prometheus.get("fragmentation", {}).get(n.name),
                prometheus.get("stranded_slices", {}).get(n.name),
                prometheus.get("stranded_gpus", {}).get(n.name),
            ]
        else:
            values = [
                _float(n.annotations.get(lbl.FRAGMENTATION_ANNOTATION)),
                _float(n.annotations.get(lbl.STRANDED_SLICES_ANNOTATION)),
                _float(n.annotations.get(lbl.STRANDED_GPUS_ANNOTATION)),
            ]
        for bucket, value in zip((frag, slices, stranded), values, strict=True):
            if value is not None:
                bucket.setdefault(name, []).append(value)
    for r in reviews.values():
        tier = policy.tier(r.tier) if policy else None
        r.expected_driver = tier.expected_driver_version if tier else None
        reference = r.expected_driver or (
            Counter(r.drivers).most_common(1)[0][0] if r.drivers else None
        )
        r.driver_drift = sum(c for d, c in r.drivers.items() if d != reference)
        if r.tier in frag:
            r.fragmentation_ratio = round(sum(frag[r.tier]) / len(frag[r.tier]), 4)
        if r.tier in slices:
            r.stranded_mig_slices = sum(slices[r.tier])
        if r.tier in stranded:
            r.stranded_gpus = sum(stranded[r.tier])
    for event in events:
        if event.get("reason") != "DrainStarted":
            continue
        when = parse_time(event.get("lastTimestamp") or event.get("firstTimestamp"))
        if when is not None and when < now_s - period_s:
            continue
        message = str(event.get("message") or "")
        match = TIER_IN_MESSAGE.search(message)
        name = match.group(1) if match else "(none)"
        r = reviews.setdefault(name, TierReview(name))
        count = int(event.get("count") or 1)
        r.drains += count
        cause = cause_key(message)
        r.drain_causes[cause] = r.drain_causes.get(cause, 0) + count
    ordered = [reviews[n] for n in order] + [r for k, r in reviews.items() if k not in order]
    source = "prometheus" if prometheus is not None else "annotations"
    return Review(period_s, source, ordered)
