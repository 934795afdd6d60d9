"""The pool review's fragmentation section: the pending history over the period, plus a live pass.

What the history keeps is described in :mod:`nodeagent_tiering.pending.history`; this module
only reads it (and, for "now", runs one diagnosis pass with the MIG planner it is given).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from nodeagent_tiering.cluster.cluster_api import Kube, KubeError
from nodeagent_tiering.cluster.tier_policy import TierPolicy
from nodeagent_tiering.cluster.view import read_view
from nodeagent_tiering.pending.diagnosis import Diagnoser
from nodeagent_tiering.pending.history import WHOLE_SIZES, Day, History, HistoryStore
from nodeagent_tiering.pending.mig import MigPlanner
from nodeagent_tiering.pending.results import PassResult, Reason, settings_for
from nodeagent_tiering.review.sections import SectionTable, TableSection


def _sum(days: Iterable[Day], pick: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for day in days:
        for k, v in pick(day).items():
            out[k] = out.get(k, 0.0) + v
    return out


def whole_template(blocks: Mapping[str, float]) -> tuple[int, float] | None:
    """The largest whole-GPU size whose multiples would have used at least half the free
    GPU-time, and that share; ``None`` without free GPU-time."""
    total = sum(blocks.values())
    if total <= 0:
        return None
    for size in WHOLE_SIZES:
        used = sum(v * ((int(k) // size) * size) / int(k) for k, v in blocks.items())
        if used / total >= 0.5:
            return size, used / total
    return 1, 1.0


def mig_template(free: float, fit: Mapping[str, float]) -> tuple[str, float] | None:
    """The profile whose new instances could have taken the most of the free slice-time."""
    if free <= 0 or not fit:
        return None
    profile, taken = max(fit.items(), key=lambda kv: (kv[1], kv[0]))
    return (profile, taken / free) if taken > 0 else None


@dataclass(frozen=True, slots=True)
class Fragmentation:
    """The fragmentation section of the pool review."""

    period_s: float
    days: int  # days of history in the period
    observed_s: float
    pending: dict[str, float]  # reason -> pod-hours
    peak: dict[str, int]
    now: dict[str, int]  # reason -> pods pending now (from a live pass)
    blocked_ns: dict[str, float]  # unit-hours blocked by contiguity
    blocked_size: dict[str, float]
    stranding_ns: dict[str, float]  # GPU-hours + slice-hours stranded beside their pods
    stranding_size: dict[str, float]
    templates: dict[str, dict[str, Any]]  # tier -> {"gpus": ..., "mig": ...}

    def to_json(self) -> dict[str, Any]:
        """Plain data."""
        return asdict(self)


def fragmentation_section(
    history: History, *, now_s: float, period_s: float, current: PassResult | None = None
) -> Fragmentation:
    """Aggregate the history over the period (and the live pass, when given)."""
    days = [d for _, d in history.window(now_s, period_s)]
    hours = 1 / 3600

    def scaled(table: Mapping[str, float]) -> dict[str, float]:
        return {k: round(v * hours, 2) for k, v in sorted(table.items(), key=lambda kv: -kv[1])}

    stranding_ns = _sum(days, lambda d: d.stranded_gpus["ns"])
    for k, v in _sum(days, lambda d: d.stranded_slices["ns"]).items():
        stranding_ns[k] = stranding_ns.get(k, 0.0) + v
    stranding_size = _sum(days, lambda d: d.stranded_gpus["size"])
    for k, v in _sum(days, lambda d: d.stranded_slices["size"]).items():
        stranding_size[k] = stranding_size.get(k, 0.0) + v
    peak: dict[str, int] = {}
    for d in days:
        for k, v in d.peak.items():
            peak[k] = max(peak.get(k, 0), v)
    tiers = {t for d in days for t in (*d.free_blocks, *d.mig_free)}
    templates: dict[str, dict[str, Any]] = {}
    for tier in sorted(tiers):
        blocks = _sum(days, lambda d, t=tier: d.free_blocks.get(t, {}))
        entry: dict[str, Any] = {}
        whole = whole_template(blocks)
        if whole is not None:
            entry["gpus"] = {"size": whole[0], "share": round(whole[1], 3)}
        free = sum(d.mig_free.get(tier, 0.0) for d in days)
        mig = mig_template(free, _sum(days, lambda d, t=tier: d.mig_fit.get(t, {})))
        if mig is not None:
            entry["mig"] = {"profile": mig[0], "share": round(mig[1], 3)}
        if entry:
            templates[tier] = entry
    now: dict[str, int] = {}
    if current is not None:
        for diag in current.diagnoses:
            now[diag.reason.value] = now.get(diag.reason.value, 0) + 1
    return Fragmentation(
        period_s=period_s,
        days=len(days),
        observed_s=sum(d.observed_s for d in days),
        pending=scaled(_sum(days, lambda d: d.pending)),
        peak=peak,
        now=now,
        blocked_ns=scaled(_sum(days, lambda d: d.blocked["ns"])),
        blocked_size=scaled(_sum(days, lambda d: d.blocked["size"])),
        stranding_ns=scaled(stranding_ns),
        stranding_size=scaled(stranding_size),
        templates=templates,
    )


def _top_ten(
    title: str, key: str, unit_hours: Mapping[str, float]
) -> tuple[str, list[str], list[list[str]]]:
    """A table of the first ten rows of ``unit_hours`` (already ordered, largest first)."""
    return title, [key, "UNIT-HOURS"], [[k, f"{v:g}"] for k, v in list(unit_hours.items())[:10]]


def section_tables(f: Fragmentation) -> list[SectionTable]:
    """The section's tables."""
    reasons = [r.value for r in Reason]
    tables = [
        (
            f"Pending GPU workloads by reason ({f.days} days of history)",
            ["REASON", "NOW", "POD-HOURS", "PEAK"],
            [
                [r, str(f.now.get(r, 0)), f"{f.pending.get(r, 0.0):g}", str(f.peak.get(r, 0))]
                for r in reasons
            ],
        ),
        _top_ten("Blocked by fragmentation (unit-hours requested)", "NAMESPACE", f.blocked_ns),
        _top_ten("Request sizes blocked by fragmentation", "REQUEST", f.blocked_size),
        _top_ten(
            "Stranding: free capacity no blocked request could use, beside these pods",
            "NAMESPACE",
            f.stranding_ns,
        ),
        _top_ten(
            "Stranding by the request size of the pods beside it", "REQUEST", f.stranding_size
        ),
    ]
    rows = []
    for tier, entry in f.templates.items():
        gpus = entry.get("gpus")
        mig = entry.get("mig")
        rows.append(
            [
                tier,
                f"{gpus['size']} GPUs ({gpus['share']:.0%} of free GPU-time)" if gpus else "-",
                f"{mig['profile']} ({mig['share']:.0%} of free slice-time)" if mig else "-",
            ]
        )
    tables.append(("Recommended request-size templates", ["TIER", "WHOLE GPUS", "MIG"], rows))
    return [SectionTable(title, headers, body) for title, headers, body in tables]


def read_fragmentation(
    kube: Kube,
    namespace: str,
    policy: TierPolicy | None,
    planner: MigPlanner,
    *,
    now_s: float,
    period_s: float,
) -> TableSection:
    """The section from the service's history ConfigMap and a live pass; what cannot be read is
    named in its ``note`` rather than failing the review."""
    notes = []
    store = HistoryStore(kube, namespace)
    try:
        history = store.load()
    except KubeError as exc:
        history = History()
        notes.append(f"history unavailable: {exc}")
    current = None
    try:
        current = Diagnoser(read_view(kube), settings_for(policy), planner).run()
    except KubeError as exc:
        notes.append(f"live pass unavailable: {exc}")
    section = fragmentation_section(history, now_s=now_s, period_s=period_s, current=current)
    data = {**section.to_json(), "source": f"ConfigMap {namespace}/{store.name}, live pass"}
    if notes:
        data["note"] = "; ".join(notes)
    return TableSection("fragmentation", "Fragmentation", data, section_tables(section))
