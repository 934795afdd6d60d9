"""The pool review's fragmentation section: the pending history over the period, plus a live pass.

What the history keeps is described in :mod:`nodeagent_tiering.pending.history`; this module
only reads it (and, for "now", runs one diagnosis pass with the MIG planner it is given).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from nodeagent_tiering.cluster.cluster_api import Kube, KubeError
from nodeagent_tiering.cluster.nodes import GPU_RESOURCE, MIG_PREFIX
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


def queue_change(request: str, mig_templates: Iterable[str]) -> str:
    """What a queue whose pods make fragmentation would change, from its main request size
    (``"<units> <resource>"``, as the history writes it)."""
    count, _, resource = request.partition(" ")
    units = int(count) if count.isdigit() else 0
    if resource == GPU_RESOURCE:
        if 0 < units < max(WHOLE_SIZES) and units not in WHOLE_SIZES:
            fit = min(s for s in WHOLE_SIZES if s > units)
            sizes = ", ".join(map(str, sorted(WHOLE_SIZES)))
            return f"ask for {fit} GPUs, not {units} (a request template: gpus {sizes})"
        if units > max(WHOLE_SIZES) and units % max(WHOLE_SIZES):
            return f"ask for whole nodes ({max(WHOLE_SIZES)} GPUs each), not {units} GPUs"
        return (
            f"pack its {units}-GPU pods on fewer nodes (kube-scheduler NodeResourcesFit "
            f"MostAllocated scoring for {GPU_RESOURCE})"
        )
    profile = resource.removeprefix(MIG_PREFIX)
    wanted = sorted(set(mig_templates) - {profile})
    if profile != resource and wanted and profile not in set(mig_templates):
        return f"ask for {' or '.join(wanted)} (the MIG template), not {profile}"
    return "keep to the request-size templates below"


def queue_account(days: Iterable[Day], mig_templates: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Per ClusterQueue over the days: on how many days its pods stranded or blocked capacity,
    how much (unit-hours), its main request size in those and what it would change; ordered by
    days, then unit-hours (the queues that make lasting fragmentation first)."""
    hours = 1 / 3600
    templates = list(mig_templates)
    seen: dict[str, int] = {}
    parts: dict[str, dict[str, float]] = {"stranded": {}, "blocking": {}}
    sizes: dict[str, dict[str, float]] = {}
    for day in days:
        for queue in {q for part in day.queues.values() for q, v in part.items() if v > 0}:
            seen[queue] = seen.get(queue, 0) + 1
        for name, table in day.queues.items():
            for queue, v in table.items():
                parts[name][queue] = parts[name].get(queue, 0.0) + v
        for queue, by_size in day.queue_sizes.items():
            mine = sizes.setdefault(queue, {})
            for size, v in by_size.items():
                mine[size] = mine.get(size, 0.0) + v
    out: dict[str, dict[str, Any]] = {}
    for queue in seen:
        stranded = parts["stranded"].get(queue, 0.0)
        blocking = parts["blocking"].get(queue, 0.0)
        main = max(sizes.get(queue, {}).items(), key=lambda kv: (kv[1], kv[0]), default=None)
        out[queue] = {
            "days": seen[queue],
            "stranded": round(stranded * hours, 2),
            "blocking": round(blocking * hours, 2),
            "request": main[0] if main else "",
            "change": queue_change(main[0], templates) if main else "",
        }
    return dict(
        sorted(out.items(), key=lambda kv: (-kv[1]["days"], -kv[1]["stranded"] - kv[1]["blocking"]))
    )


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
    # ClusterQueue -> days, stranded and blocking unit-hours, main request, change (see
    # :func:`queue_account`), the lasting ones first
    queues: dict[str, dict[str, Any]]

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
    mig_templates = [e["mig"]["profile"] for e in templates.values() if "mig" in e]
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
        queues=queue_account(days, mig_templates),
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
    tables.append(
        (
            "Queues whose pods make lasting fragmentation (stranding beside them, or in the way "
            "of a blocked request)",
            [
                "CLUSTERQUEUE",
                "DAYS",
                "STRANDED UNIT-HOURS",
                "BLOCKING UNIT-HOURS",
                "REQUEST",
                "CHANGE",
            ],
            [
                [
                    q,
                    str(a["days"]),
                    f"{a['stranded']:g}",
                    f"{a['blocking']:g}",
                    a["request"] or "-",
                    a["change"] or "-",
                ]
                for q, a in list(f.queues.items())[:10]
            ],
        )
    )
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
