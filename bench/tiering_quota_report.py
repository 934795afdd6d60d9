"""The pool review with its quota section at scale: 5,000 nodes, 200 teams, 100,000 workloads.

The cluster is a simulated month (:mod:`nodeagent.testing.kueue_month`): 5,000 GPU nodes in
three tiers, 200 teams with a ClusterQueue in each tier they use, 100,000 Workloads with their
admissions and conditions, the ~120,000 pods that ran them, and the drain Events. Each object
list is first serialized to JSON, as the API server's list responses carry it; a measured run
then does what ``nodeagent tiering report --quota ... --json --html`` does after the reads:

1. decode the lists (``json.loads``, as the reader does with each response);
2. build the tier review and the quota section (sweep of the admissions per cohort, waits,
   failures, capacity behind the guarantees, what to change);
3. render the table rows, the JSON and the HTML page.

The command pauses Python's cyclic garbage collector while it reads and builds
(``cluster.memory.gc_paused``); the measured runs do the same. Baselines, same run: the same
report with the collector left on (one run: what the pause saves), and the tier review alone
(no quota section) over the same 5,000 nodes and Events -- what the review cost before.
Target: the whole report under 10 s. Median of ``--runs`` runs, wall clock per phase and the
process's CPU time for the whole (on a shared machine the two differ by what others take).

Run: ``.venv/bin/python bench/tiering_quota_report.py [--nodes 5000] [--teams 200]
[--workloads 100000] [--runs 3]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from typing import Any

from tiering_common import count_options

from nodeagent.testing.kueue_month import simulate
from nodeagent_tiering.cluster import kueue
from nodeagent_tiering.cluster.memory import gc_paused
from nodeagent_tiering.cluster.nodes import Node
from nodeagent_tiering.review.build import assemble_review
from nodeagent_tiering.review.inputs import ReviewInputs
from nodeagent_tiering.review.quota_section import QuotaSection
from nodeagent_tiering.review.render import render_html, table_rows
from nodeagent_tiering.review.tiers import build_review

TARGET_S = 10.0
KINDS = ("nodes", "pods", "events", "flavors", "cluster_queues", "local_queues", "workloads")


def measure(bodies: dict[str, bytes], now_s: float, period_s: float) -> dict[str, float]:
    times: dict[str, float] = {}
    cpu = time.process_time()
    t = time.perf_counter()
    lists: dict[str, Any] = {k: json.loads(v)["items"] for k, v in bodies.items()}
    times["decode"] = time.perf_counter() - t
    t = time.perf_counter()
    inputs = ReviewInputs(now_s=now_s, period_s=period_s, kueue=kueue.KueueApi("v1beta2"), **lists)
    review = assemble_review(inputs)
    # The quota section is one of several (the shared-GPU section follows it).
    section = next(s for s in review.sections if isinstance(s, QuotaSection))
    times["build"] = time.perf_counter() - t
    t = time.perf_counter()
    table_rows(review)
    for table in section.tables():
        assert table.rows
    json.dumps(review.to_json())
    render_html(review, generated="bench")
    times["render"] = time.perf_counter() - t
    times["total"] = sum(times.values())
    times["cpu"] = time.process_time() - cpu
    times["_rows"] = len(section.rows)
    times["_findings"] = len(section.findings)
    return times


def baseline(bodies: dict[str, bytes], now_s: float, period_s: float) -> float:
    t = time.perf_counter()
    nodes = json.loads(bodies["nodes"])["items"]
    events = json.loads(bodies["events"])["items"]
    review = build_review(
        [Node.from_object(o) for o in nodes],
        events,
        policy=None,
        now_s=now_s,
        period_s=period_s,
    )
    json.dumps(review.to_json())
    render_html(review, generated="bench")
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    count_options(parser, nodes=5000, teams=200, workloads=100_000, runs=3)
    args = parser.parse_args()
    started = time.perf_counter()
    month = simulate(
        seed=1,
        teams=args.teams,
        nodes_per_tier=-(-args.nodes // 3),
        workloads=args.workloads,
    )
    bodies = {k: json.dumps({"items": getattr(month, k)}).encode() for k in KINDS}
    counts = (len(month.nodes), len(month.queues), len(month.workloads), len(month.pods))
    now_s, period_s, events = month.now_s, month.period_s, len(month.events)
    del month  # the command holds only what it read
    gc.collect()
    print(
        f"simulated in {time.perf_counter() - started:.1f}s: {counts[0]} nodes, "
        f"{counts[1]} ClusterQueues of {args.teams} teams, {counts[2]} workloads, "
        f"{counts[3]} pods, {events} events; "
        f"{sum(len(b) for b in bodies.values()) / 2**20:.0f} MiB of JSON"
    )
    runs = []
    for _ in range(args.runs):
        with gc_paused():
            runs.append(measure(bodies, now_s, period_s))
        gc.collect()
    collector_on = measure(bodies, now_s, period_s)["total"]
    gc.collect()
    base = [baseline(bodies, now_s, period_s) for _ in range(args.runs)]
    print(f"\n{'phase':<30}{'median s':>10}{'min s':>10}{'max s':>10}")
    for phase in ("decode", "build", "render", "total", "cpu"):
        values = [r[phase] for r in runs]
        print(
            f"{phase:<30}{statistics.median(values):>10.2f}{min(values):>10.2f}{max(values):>10.2f}"
        )
    print(f"{'baseline: collector on (1 run)':<30}{collector_on:>10.2f}")
    print(
        f"{'baseline: tier review only':<30}{statistics.median(base):>10.2f}{min(base):>10.2f}"
        f"{max(base):>10.2f}"
    )
    total = statistics.median(r["total"] for r in runs)
    print(
        f"\n{int(runs[0]['_rows'])} tier/team rows, {int(runs[0]['_findings'])} findings; "
        f"total {total:.2f}s (target < {TARGET_S:.0f}s): {'ok' if total < TARGET_S else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
