"""The pool review's shared-GPU section: every GPU several workloads share, worst first.

Read from the agents' ``nodeagent.io/gpu-state`` annotations (``if``: the interference ratio
of the GPU's worst shared device, ``sw``: its workloads, ``ps``: the pods holding it), so it
needs no Prometheus. The interference ratio is the agent's noisy-neighbour signal
(docs/sharing.md): starvation below the fair share while saturated, memory pressure above 0.8,
throttling.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nodeagent import labels as lbl
from nodeagent.published import PublishedError, decode
from nodeagent_tiering.nodes import NodeView
from nodeagent_tiering.report import SectionTable, TableSection

HEADERS = ["NODE", "TIER", "GPU", "WORKLOADS", "INTERFERENCE", "PODS"]
NOISY_RATIO = 0.5  # the NodeagentSharedGpuInterference alert's threshold


def sharing_section(nodes: Sequence[NodeView], *, limit: int = 50) -> TableSection:
    """Shared GPUs by interference, worst first (at most ``limit`` rows)."""
    rows: list[dict[str, Any]] = []
    unreadable = 0
    for node in nodes:
        raw = node.annotations.get(lbl.GPU_STATE_ANNOTATION)
        if not raw:
            continue
        try:
            published = decode(raw)
        except PublishedError:
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
                    "pods": list(gpu.pods),
                }
            )
    rows.sort(key=lambda r: (-r["interference_ratio"], r["node"], r["gpu"]))
    noisy = sum(1 for r in rows if r["interference_ratio"] >= NOISY_RATIO)
    notes = [
        f"{len(rows)} shared GPUs, {noisy} at interference {NOISY_RATIO} or more "
        "(the NodeagentSharedGpuInterference alert's threshold)"
    ]
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
                ", ".join(r["pods"]) or "-",
            ]
            for r in rows[:limit]
        ],
        notes,
    )
    data = {"gpus": rows[:limit], "shared_gpus": len(rows), "noisy_gpus": noisy}
    return TableSection("shared_gpus", "Shared GPUs", data, [table])
