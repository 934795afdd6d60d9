"""The pool review: per tier, nodes and GPUs, health, driver drift, MIG layouts, fragmentation,
stranded capacity, and drains with their causes over a period.

Inputs are what the agents and the service publish on the API server (labels, annotations,
Events). Fragmentation and stranded capacity come from a Prometheus query API when one is given
(the exporter's ``nodeagent_mig_fragmentation_ratio``, ``nodeagent_stranded_mig_slices`` and
``nodeagent_stranded_gpus``, grouped by the target label that names the node), else from node
annotations the agents publish. Output: a table, JSON, or a self-contained HTML page.
"""

from __future__ import annotations

import html
import json
import re
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from nodeagent import labels as lbl
from nodeagent_tiering.kube import parse_time
from nodeagent_tiering.nodes import NodeView
from nodeagent_tiering.policy import Stability, TierPolicy

MIG_CONFIG_LABEL = lbl.MIG_CONFIG  # mig-manager's label naming the node's layout

PROM_QUERIES = {
    "fragmentation": "avg by ({node}) (nodeagent_mig_fragmentation_ratio)",
    "stranded_slices": "sum by ({node}) (nodeagent_stranded_mig_slices)",
    "stranded_gpus": "sum by ({node}) (nodeagent_stranded_gpus)",
}

TIER_IN_MESSAGE = re.compile(r"\(tier ([^)]+)\)")


class ReportError(Exception):
    """The review could not be built (e.g. Prometheus unreachable)."""


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


@dataclass(frozen=True)
class SectionTable:
    """A table of a review section, with lines printed under it."""

    title: str
    headers: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class TableSection:
    """A review section that is only tables: its HTML is the tables under a heading."""

    key: str
    title: str
    data: dict[str, Any]
    table_list: list[SectionTable]

    def to_json(self) -> dict[str, Any]:
        """Its plain data."""
        return self.data

    def tables(self) -> list[SectionTable]:
        """Its tables."""
        return self.table_list

    def html(self) -> str:
        """A heading, then each table (``none`` when empty) with its notes."""
        parts = [f"<h2>{html.escape(self.title)}</h2>"]
        for table in self.table_list:
            parts.append(f"<h3>{html.escape(table.title)}</h3>")
            parts.append(_table_html(table.headers, table.rows) if table.rows else "<p>none</p>")
            parts.extend(f"<p>{html.escape(note)}</p>" for note in table.notes)
        return "\n".join(parts)


class ReviewSection(Protocol):
    """A part of the review built by another module (quotas and queues, ...), added to
    :attr:`Review.sections`: it appears under ``key`` in ``--json``, as tables after the tier
    table in the text output, and before the details in the HTML page."""

    @property
    def key(self) -> str:
        """Its key in ``--json``."""
        ...

    def to_json(self) -> dict[str, Any]:
        """Its plain data."""
        ...

    def tables(self) -> list[SectionTable]:
        """Its tables for the text output."""
        ...

    def html(self) -> str:
        """Its part of the page (self-contained: no scripts, no external resources)."""
        ...


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


def instant_query(url: str, query: str, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """The result vector of one instant query against the Prometheus HTTP API."""
    if not url.startswith(("http://", "https://")):
        raise ReportError(f"--prometheus {url!r} is not an http(s) URL")
    full = f"{url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    try:
        with urllib.request.urlopen(full, timeout=timeout_s) as resp:  # noqa: S310
            body = json.loads(resp.read())
    except (OSError, ValueError) as exc:
        raise ReportError(f"cannot query Prometheus at {url}: {exc}") from exc
    if body.get("status") != "success":
        raise ReportError(f"Prometheus refused {query!r}: {body.get('error', 'unknown')}")
    result: list[dict[str, Any]] = (body.get("data") or {}).get("result") or []
    return result


def query_prometheus(
    url: str, node_label: str, timeout_s: float = 10.0
) -> dict[str, dict[str, float]]:
    """Per-node values of each query in :data:`PROM_QUERIES` from the Prometheus HTTP API."""
    out: dict[str, dict[str, float]] = {}
    for key, template in PROM_QUERIES.items():
        values: dict[str, float] = {}
        for sample in instant_query(url, template.format(node=node_label), timeout_s):
            node = (sample.get("metric") or {}).get(node_label)
            if node is not None:
                values[node] = float(sample["value"][1])
        out[key] = values
    return out


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
    nodes: Sequence[NodeView],
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
        if n.drain is not None:
            r.quarantined += 1
        elif n.stability is Stability.UNSTABLE:
            r.unstable += 1
        elif n.stability is Stability.DEGRADED:
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


# --- rendering ---------------------------------------------------------------------------------


def _fmt(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if value != int(value) else str(int(value))


def _counts(data: Mapping[str, int]) -> str:
    return ", ".join(f"{k} x{v}" for k, v in sorted(data.items(), key=lambda kv: -kv[1])) or "-"


TABLE_HEADERS = [
    "TIER", "NODES", "GPUS", "HEALTHY", "DEGRADED", "UNSTABLE", "QUARANTINED", "DRIVER DRIFT",
    "MIG LAYOUTS", "FRAGMENTATION", "STRANDED SLICES", "STRANDED GPUS", "DRAINS", "CAUSES",
]  # fmt: skip


def table_rows(review: Review) -> list[list[str]]:
    """Rows for the plain-text table."""
    return [
        [
            r.tier,
            str(r.nodes),
            str(r.gpus),
            str(r.healthy),
            str(r.degraded),
            str(r.unstable),
            str(r.quarantined),
            f"{r.driver_drift} ({_counts(r.drivers)})" if r.driver_drift else "0",
            _counts(r.mig_layouts),
            _fmt(r.fragmentation_ratio),
            _fmt(r.stranded_mig_slices),
            _fmt(r.stranded_gpus),
            str(r.drains),
            _counts(r.drain_causes),
        ]
        for r in review.tiers
    ]


_COLOURS = {
    "healthy": "#2e7d32",
    "degraded": "#f9a825",
    "unstable": "#c62828",
    "quarantined": "#6a1b9a",
}


def _stacked_bars(review: Review) -> str:
    """Inline SVG: one horizontal bar per tier, stacked by health."""
    width, row, left = 640, 28, 130
    biggest = max((r.nodes for r in review.tiers), default=0) or 1
    height = row * len(review.tiers) + 40
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'role="img" aria-label="nodes per tier by health">'
    ]
    for i, r in enumerate(review.tiers):
        y = 10 + i * row
        parts.append(
            f'<text x="{left - 8}" y="{y + 15}" text-anchor="end" font-size="13">'
            f"{html.escape(r.tier)}</text>"
        )
        x = float(left)
        for state in ("healthy", "degraded", "unstable", "quarantined"):
            count = getattr(r, state)
            if not count:
                continue
            w = (width - left - 60) * count / biggest
            parts.append(
                f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="20" fill="{_COLOURS[state]}">'
                f"<title>{state}: {count}</title></rect>"
            )
            x += w
        parts.append(f'<text x="{x + 6:.1f}" y="{y + 15}" font-size="12">{r.nodes}</text>')
    legend_y = height - 12
    for j, (state, colour) in enumerate(_COLOURS.items()):
        lx = left + j * 120
        parts.append(f'<rect x="{lx}" y="{legend_y - 10}" width="12" height="12" fill="{colour}"/>')
        parts.append(f'<text x="{lx + 16}" y="{legend_y}" font-size="12">{state}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _simple_bars(title: str, values: Mapping[str, float]) -> str:
    """Inline SVG: a vertical bar per key."""
    width, height, base = 640, 200, 170
    keys = list(values)
    top = max(values.values(), default=0) or 1
    slot = (width - 40) / max(len(keys), 1)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'role="img" aria-label="{html.escape(title)}">'
    ]
    for i, key in enumerate(keys):
        h = (base - 20) * values[key] / top
        x = 20 + i * slot + slot * 0.15
        parts.append(
            f'<rect x="{x:.1f}" y="{base - h:.1f}" width="{slot * 0.7:.1f}" height="{h:.1f}" '
            f'fill="#1565c0"><title>{html.escape(key)}: {_fmt(values[key])}</title></rect>'
        )
        parts.append(
            f'<text x="{x + slot * 0.35:.1f}" y="{base - h - 4:.1f}" font-size="12" '
            f'text-anchor="middle">{_fmt(values[key])}</text>'
        )
        parts.append(
            f'<text x="{x + slot * 0.35:.1f}" y="{base + 16}" font-size="12" '
            f'text-anchor="middle">{html.escape(key)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def render_html(review: Review, *, generated: str) -> str:
    """A self-contained page (no scripts, no external resources) for the monthly review."""
    rows = table_rows(review)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in TABLE_HEADERS)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows
    )
    gpus = {r.tier: float(r.gpus) for r in review.tiers}
    drains = {r.tier: float(r.drains) for r in review.tiers}
    causes: Counter[str] = Counter()
    for r in review.tiers:
        causes.update(r.drain_causes)
    days = review.period_s / 86400
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>GPU pool review</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #212121; }}
table {{ border-collapse: collapse; font-size: 13px; }}
th, td {{ border: 1px solid #bdbdbd; padding: 4px 8px; text-align: left; }}
th {{ background: #eeeeee; }}
h2 {{ margin-top: 1.6em; }}
</style></head><body>
<h1>GPU pool review</h1>
<p>Generated {html.escape(generated)}; drains over the last {days:g} days; fragmentation and
stranded capacity from {html.escape(review.source)}.</p>
<h2>Nodes per tier by health</h2>
{_stacked_bars(review)}
<h2>GPUs per tier</h2>
{_simple_bars("GPUs per tier", gpus)}
<h2>Drains per tier</h2>
{_simple_bars("drains per tier", drains)}
<h2>Drain causes</h2>
{_simple_bars("drain causes", {k: float(v) for k, v in causes.most_common(8)})}
{"".join(section.html() for section in review.sections)}
<h2>Details</h2>
<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>
</body></html>
"""


def _table_html(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
