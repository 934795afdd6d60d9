"""The pool review rendered: the tier table's rows and the self-contained HTML page (no I/O here;
the command prints or writes what these return)."""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Mapping

from nodeagent_tiering.review.tiers import Review


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


# What a chart with nothing to draw says, as the sections' empty tables do (not a blank area).
_NONE = "<p>none</p>"


def _stacked_bars(review: Review) -> str:
    """Inline SVG: one horizontal bar per tier, stacked by health; "none" without tiers."""
    if not review.tiers:
        return _NONE
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
    """Inline SVG: a vertical bar per key; "none" when every value is 0, as empty tables say."""
    if not any(values.values()):
        return _NONE
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
