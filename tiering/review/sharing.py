"""The pool review's shared-GPU section: every GPU several workloads share, worst first.

Read from the agents' ``nodeagent.io/gpu-state`` annotations (``if``: the interference ratio
of the GPU's worst shared device, ``sw``: its workloads, ``ps``: the pods holding it), so it
needs no Prometheus. The interference ratio is the agent's noisy-neighbour signal
(docs/sharing.md): starvation below the fair share while saturated, memory pressure above 0.8,
throttling. Where the agent measures the GPU's SM and DRAM activity (GPM, Hopper and later:
``sm``, ``dr``), a high ratio is judged by them: contention is real when the SMs or the memory
are busy; with both idle, a saturated coarse utilisation is time-slicing's switching, not
workloads competing for compute.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nodeagent import labels as lbl
from nodeagent_tiering.cluster.nodes import Node
from nodeagent_tiering.review.sections import SectionTable, TableSection

HEADERS = ["NODE", "TIER", "GPU", "WORKLOADS", "INTERFERENCE", "SM", "DRAM", "JUDGED", "PODS"]
NOISY_RATIO = 0.5  # the NodeagentSharedGpuInterference alert's threshold
BUSY_ACTIVITY = 0.5  # SM or DRAM activity from which a high interference ratio is contention


def judged(interference: float, sm: float | None, dram: float | None) -> str:
    """How a shared GPU's interference reads: ``contended``, ``coarse-only`` (high ratio, but
    SMs and memory idle), ``ok`` (under the threshold) or ``unmeasured`` (no GPM figures)."""
    if interference < NOISY_RATIO:
        return "ok"
    if sm is None and dram is None:
        return "unmeasured"
    if max(sm or 0.0, dram or 0.0) >= BUSY_ACTIVITY:
        return "contended"
    return "coarse-only"


def sharing_section(nodes: Sequence[Node], *, limit: int = 50) -> TableSection:
    """Shared GPUs by interference, worst first (at most ``limit`` rows)."""
    rows: list[dict[str, Any]] = []
    unreadable = 0
    for node in nodes:
        published = node.published
        if published is None:
            # An empty annotation is no annotation; one that is there and unreadable is counted.
            if node.published_error is not None and node.annotations.get(lbl.GPU_STATE_ANNOTATION):
                unreadable += 1
            continue
        for gpu in published.gpus:
            if gpu.interference is None:
                continue
            rows.append(
                {
                    "node": node.name,
                    "tier": node.labels.get(lbl.TIER, ""),
                    "gpu": gpu.index,
                    "workloads": gpu.shared_workloads,
                    "interference_ratio": gpu.interference,
                    "sm_active_ratio": gpu.sm_active,
                    "dram_active_ratio": gpu.dram_active,
                    "judged": judged(gpu.interference, gpu.sm_active, gpu.dram_active),
                    "pods": list(gpu.pods),
                }
            )
    rows.sort(key=lambda r: (-r["interference_ratio"], r["node"], r["gpu"]))
    noisy = sum(1 for r in rows if r["interference_ratio"] >= NOISY_RATIO)
    coarse_only = sum(1 for r in rows if r["judged"] == "coarse-only")
    notes = [
        f"{len(rows)} shared GPUs, {noisy} at interference {NOISY_RATIO} or more "
        "(the NodeagentSharedGpuInterference alert's threshold)"
    ]
    if coarse_only:
        notes.append(
            f"{coarse_only} of them with SMs and memory under {BUSY_ACTIVITY:.0%} active: "
            "time-slice switching, not contention (fewer replicas will not help them)"
        )
    if len(rows) > limit:
        notes.append(f"showing the {limit} worst")
    if unreadable:
        notes.append(f"{unreadable} nodes with an unreadable gpu-state annotation left out")
    table = SectionTable(
        "Shared GPUs by interference",
        HEADERS,
        [
            [
                r["node"],
                r["tier"] or "-",
                str(r["gpu"]),
                str(r["workloads"]),
                f"{r['interference_ratio']:.2f}",
                _percent(r["sm_active_ratio"]),
                _percent(r["dram_active_ratio"]),
                r["judged"],
                ", ".join(r["pods"]) or "-",
            ]
            for r in rows[:limit]
        ],
        notes,
    )
    data = {
        "gpus": rows[:limit],
        "shared_gpus": len(rows),
        "noisy_gpus": noisy,
        "coarse_only_gpus": coarse_only,
    }
    return TableSection("shared_gpus", "Shared GPUs", data, [table])


def _percent(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.0%}"
