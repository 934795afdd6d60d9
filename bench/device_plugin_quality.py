"""Allocation quality of GetPreferredAllocation for whole GPUs, on every preset.

Run: ``python bench/device_plugin_quality.py [--patterns N]``. For random availability patterns,
sizes and must_include sets, compares in the same run: the plugin's choice, the exhaustive
optimum (every set, every split of the remainder), and naive first-N (the lowest available
indices plus must_include). Scores are NVIDIA's best-effort link scores; "total" is the chosen
set's score plus the best split of the remaining GPUs into groups of the same size. The optimum
and every score come from the independent reference in ``tests/device_plugin/optimum.py``, which
shares no code with the plugin's search.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
from pathlib import Path

from device_plugin_common import table

from nodeagent.agent.backend import open_node
from nodeagent.sim.presets import preset_names
from nodeagent.testing.optimum import Reference
from nodeagent_device_plugin.preferred import ScoreTable, preferred_gpus


def first_n(available: list[int], must: list[int], size: int) -> list[int]:
    chosen = list(dict.fromkeys(must))
    for g in available:
        if len(chosen) == size:
            break
        if g not in chosen:
            chosen.append(g)
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--patterns", type=int, default=200)
    args = parser.parse_args()
    rows: list[tuple[object, ...]] = []
    for preset in preset_names():
        node = open_node(simulate=preset, state_dir=Path(tempfile.mkdtemp()) / preset)
        snapshot = node.snapshot()
        node.close()
        numa = {g.info.index: g.info.numa_node for g in snapshot.gpus}
        tbl = ScoreTable.from_topology(snapshot.topology, numa)
        reference = Reference.from_snapshot(snapshot)
        gpus = sorted(numa)
        if len(gpus) < 2:
            rows.append((preset, 0, "-", "-", "-", "-", "-", "-"))
            continue
        rng = random.Random(preset)
        equal = naive_equal = 0
        ours_own, opt_own, naive_own, ours_rest, opt_rest, naive_rest = [], [], [], [], [], []
        for _ in range(args.patterns):
            available = sorted(rng.sample(gpus, rng.randint(2, len(gpus))))
            size = rng.randint(1, len(available) - 1) if len(available) > 1 else 1
            must = rng.sample(available, rng.randint(0, min(size, 1)))
            ours = reference.score(available, preferred_gpus(tbl, available, must, size), size)
            naive = reference.score(available, first_n(available, must, size), size)
            best = reference.optimum(available, must, size)
            equal += ours[:2] == best[:2]
            naive_equal += naive[0] == best[0]
            ours_own.append(ours[1])
            opt_own.append(best[1])
            naive_own.append(naive[1])
            ours_rest.append(ours[2])
            opt_rest.append(best[2])
            naive_rest.append(naive[2])
        n = args.patterns
        rows.append((
            preset, n, f"{equal}/{n}", f"{naive_equal}/{n}",
            f"{statistics.mean(ours_own):.0f} / {statistics.mean(ours_rest):.0f}",
            f"{statistics.mean(opt_own):.0f} / {statistics.mean(opt_rest):.0f}",
            f"{statistics.mean(naive_own):.0f} / {statistics.mean(naive_rest):.0f}",
        ))  # fmt: skip
    headers = [
        "preset",
        "patterns",
        "plugin = optimum",
        "first-N = optimum",
        "plugin set / remainder",
        "optimum set / remainder",
        "first-N set / remainder",
    ]
    print(table(headers, rows))


if __name__ == "__main__":
    main()
