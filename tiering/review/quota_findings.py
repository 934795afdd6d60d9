"""The quota section's short "what to change" list, from its rows, its capacity table and the
admissions (thresholds below)."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Sequence

from nodeagent import labels as lbl
from nodeagent_tiering.cluster.nodes import GPU_RESOURCE as WHOLE_GPU
from nodeagent_tiering.cluster.nodes import Node
from nodeagent_tiering.review.quota_section import QuotaSection, duration_text
from nodeagent_tiering.review.quota_section import number_text as _n
from nodeagent_tiering.review.quota_usage import Interval, Resolver

# "What to change" thresholds.
UNUSED_SHARE = 0.10  # a guarantee used less than this on average is mostly idle
BORROW_SHARE = 0.5  # borrowing more than this share of the guarantee on average
LONG_WAIT_S = 3600.0  # p90 queue wait worth acting on
FAILURE_SHARE = 0.05  # share of pods ended by GPU faults or drains worth acting on
WHOLE_GPUS = re.compile(re.escape(WHOLE_GPU) + "$")
STRANDING_SHARE = 0.2  # share of a tier's GPU-hours in request sizes that strand GPUs


def findings(
    section: QuotaSection,
    intervals: Sequence[Interval],
    res: Resolver,
    nodes: Sequence[Node],
) -> list[str]:
    """The short "what to change" list (thresholds at the top of this module)."""
    out: list[str] = []
    for b in section.backing:
        promise = (
            f"tier {b.row.tier}: {_n(b.row.promised)} {b.row.resource} guaranteed on {b.row.flavor}"
        )
        if b.row.promised > b.row.installed:
            out.append(
                f"{promise}, more than the {_n(b.row.installed)} its nodes have: add nodes or "
                "lower the guarantees"
            )
        elif b.row.promised > b.row.healthy:
            lost = f" ({'; '.join(b.lost[:3])})" if b.lost else ""
            out.append(
                f"{promise}, the healthy nodes hold {_n(b.row.healthy)} of "
                f"{_n(b.row.installed)}{lost}: return or replace the nodes, or lower the "
                "guarantees"
            )
    for r in section.rows:
        for name, u in sorted(r.resources.items()):
            if (
                u.guaranteed >= 1
                and u.used_avg is not None
                and u.used_avg < UNUSED_SHARE * u.guaranteed
            ):
                out.append(
                    f"team {r.team}, tier {r.tier}: uses {_n(u.used_avg)} of {_n(u.guaranteed)} "
                    f"guaranteed {name} on average ({u.used_avg / u.guaranteed:.0%}): lower the "
                    "guarantee, or make it soft so others can borrow it"
                )
            if (
                u.borrowed_avg is not None
                and u.borrowed_avg >= 1
                and (u.borrowed_avg > BORROW_SHARE * u.guaranteed)
            ):
                out.append(
                    f"team {r.team}, tier {r.tier}: borrows {_n(u.borrowed_avg)} {name} on "
                    f"average on top of {_n(u.guaranteed)} guaranteed: raise the guarantee, or "
                    "expect its work to be preempted when the owners reclaim"
                )
        if r.waits.p90_s is not None and r.waits.p90_s > LONG_WAIT_S:
            out.append(
                f"team {r.team}, tier {r.tier}: p90 queue wait {duration_text(r.waits.p90_s)} "
                f"({r.waits.admitted} admitted, {r.waits.pending} pending): raise its guarantee "
                "or borrow limit, or move work to a tier with idle quota"
            )
    per_tier: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    causes: dict[str, Counter[str]] = defaultdict(Counter)
    for r in section.rows:
        per_tier[r.tier][0] += r.failures.infra
        per_tier[r.tier][1] += r.failures.ended
        causes[r.tier].update(r.failures.causes)
    for tier, (infra, ended) in sorted(per_tier.items()):
        if ended and infra / ended > FAILURE_SHARE:
            top = ", ".join(f"{k} x{v}" for k, v in causes[tier].most_common(3))
            out.append(
                f"tier {tier}: {infra} of {ended} GPU pods ({infra / ended:.0%}) ended on GPU "
                f"faults or drains ({top}): look at the nodes behind the causes, and have jobs "
                "checkpoint"
            )
    t0 = section.now_s - section.period_s
    out.extend(stranding(intervals, res, nodes, t0, section.now_s))
    return out


def stranding(
    intervals: Sequence[Interval],
    res: Resolver,
    nodes: Sequence[Node],
    t0: float,
    t1: float,
) -> list[str]:
    """Request sizes that leave GPUs idle on every node they fill (3 GPUs per pod on 8-GPU
    nodes: two fit, two GPUs stay stranded)."""
    node_size: dict[str, Counter[int]] = defaultdict(Counter)
    for n in nodes:
        tier = n.labels.get(lbl.TIER)
        gpus = n.amounts(WHOLE_GPUS).get(WHOLE_GPU, 0.0)
        if tier and gpus >= 1:
            node_size[str(tier)][int(gpus)] += 1
    held: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for iv in intervals:
        if iv.resource != "nvidia.com/gpu" or iv.per_pod < 1:
            continue
        span = min(iv.end, t1) - max(iv.start, t0)
        if span > 0:
            held[res.tier(iv.flavor)][int(iv.per_pod)] += iv.amount * span
    out = []
    for tier, by_size in sorted(held.items()):
        total = sum(by_size.values())
        sizes = node_size.get(tier)
        if not total or not sizes:
            continue
        node = sizes.most_common(1)[0][0]
        for size, gpu_s in sorted(by_size.items()):
            stranded = node % size if size < node else 0
            share = gpu_s / total
            if stranded and share >= STRANDING_SHARE:
                fits = node // size
                ok = ", ".join(str(d) for d in range(1, node + 1) if node % d == 0)
                out.append(
                    f"tier {tier}: {share:.0%} of admitted GPU time is {size}-GPU pods on "
                    f"{node}-GPU nodes: {fits} fit per node and {stranded} GPUs stay stranded; "
                    f"ask for {ok} GPUs per pod"
                )
    return out
