"""DRA: NodePrepareResources latency for dynamic MIG, and the placement order under churn.

    python bench/dra_prepare.py [--prepares 200] [--events 3000] [--seeds 2]

1. **Prepare latency.** A DRA plugin on a simulated DGX H100 (MIG on), served on its real unix
   sockets, driven by the test kubelet over gRPC: NodePrepareResources of a claim whose device
   is a dynamic MIG placement (the plugin writes the intent, creates the GPU and compute
   instance through NVML, confirms the checkpoint, writes the CDI spec), then
   NodeUnprepareResources (destroys it). Baseline in the same run: a claim on a pre-existing
   MIG instance (no create: checkpoint and CDI spec only). Median and p99 in milliseconds.
2. **Churn fragmentation.** The kube-scheduler takes the first published device that matches a
   request. The driver publishes each GPU's placements in the planner's order (least future
   capacity lost first, ``nodeagent.capacity.preferred_placements``); the baseline is a
   scheduler picking any free published placement. The order of GPUs is the scheduler's in
   both (modelled as random). Requests arrive and leave as in bench/mig_churn.py (Poisson, mean
   holding 10, small profiles favoured); a request no GPU can place is rejected (the scheduler
   never moves a running instance). Reported: share rejected and the mean fragmentation ratio
   over GPUs and time, and their ratios to the planner order.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, __file__.rsplit("/", 1)[0])
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mig_churn import GPUS, Event, Occupancy, trace
from mig_common import geometries

from nodeagent.agent.backend import open_node
from nodeagent.capacity import fragmentation_ratio, preferred_placements
from nodeagent.gpu.types import MigGeometry, MigSlot, Placement
from nodeagent.testing.drakubelet import TestDraKubelet
from nodeagent.testing.nodes import enable_mig
from tests.dra.plugin_support import Claims, claim_json, make_driver, serve


def _quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def prepare_latency(n: int) -> dict[str, list[float]]:
    """Milliseconds per call: dynamic prepare, its unprepare, prepare of an existing instance."""
    out: dict[str, list[float]] = {"dynamic prepare": [], "dynamic unprepare": [], "existing": []}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        node = open_node(simulate="dgx-h100", state_dir=root / "sim")
        enable_mig(node, {0: [], 1: []})
        node.create_gpu_instance(1, "3g.40gb", Placement(4, 4))
        claims = Claims()
        server = serve(make_driver(node, root, claims), root)
        kubelet = TestDraKubelet(root / "plugins_registry")
        connection = kubelet.register()
        devices = [f"gpu-0-mig-1g10gb-19-{s}" for s in range(7)] + ["gpu-0-mig-3g40gb-9-0"]
        try:
            for i in range(n):
                ref = claims.add(claim_json(f"d{i}", [("r", devices[i % len(devices)])]))
                t0 = time.perf_counter()
                answer = connection.prepare([ref])[ref[1]]
                t1 = time.perf_counter()
                assert answer.error == "", answer.error
                assert connection.unprepare([ref]) == {ref[1]: ""}
                t2 = time.perf_counter()
                out["dynamic prepare"].append((t1 - t0) * 1e3)
                out["dynamic unprepare"].append((t2 - t1) * 1e3)
                ref = claims.add(claim_json(f"s{i}", [("r", "gpu-1-mig-3g40gb-9-4")]))
                t0 = time.perf_counter()
                answer = connection.prepare([ref])[ref[1]]
                out["existing"].append((time.perf_counter() - t0) * 1e3)
                assert answer.error == ""
                assert connection.unprepare([ref]) == {ref[1]: ""}
        finally:
            kubelet.close()
            server.stop()
            node.close()
    return out


def _free_placements(geometry: MigGeometry, gpu: list[MigSlot], profile: str) -> list[Placement]:
    return preferred_placements(geometry, gpu, profile)


def churn(
    geometry: MigGeometry, events: list[Event], policy: str, seed: int
) -> tuple[float, float]:
    """(share rejected, mean fragmentation) of one trace under ``policy``."""
    rng = random.Random(seed)
    occupancy = Occupancy()
    node = occupancy.node
    rejected = asked = 0
    frag: list[float] = []
    for e in events:
        if e.kind == "leave":
            occupancy.leave(e.job)
            continue
        asked += 1
        order = list(range(GPUS))
        rng.shuffle(order)  # the scheduler's order of the pool's slices
        spot = None
        for g in order:
            free = _free_placements(geometry, node[g], e.profile)
            if free:
                spot = (g, free[0] if policy == "planner order" else rng.choice(free))
                break
        if spot is None:
            rejected += 1
        else:
            occupancy.place(e.job, spot[0], MigSlot(e.profile, spot[1]))
        frag.append(statistics.fmean(fragmentation_ratio(geometry, g) for g in node))
    return rejected / max(asked, 1), statistics.fmean(frag)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prepares", type=int, default=200)
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--loads", default="0.9,1.2")
    args = parser.parse_args()
    print("machine: 2 cores, 24 GiB; simulated NVML; real gRPC over unix sockets\n")
    lat = prepare_latency(args.prepares)
    base = statistics.median(lat["existing"])
    print(f"NodePrepareResources, {args.prepares} claims each (ms)")
    print(f"{'call':<20} {'p50':>8} {'p99':>8} {'p50 / existing':>15}")
    for name, samples in lat.items():
        p50 = statistics.median(samples)
        print(f"{name:<20} {p50:8.2f} {_quantile(samples, 0.99):8.2f} {p50 / base:15.2f}")
    print()
    models = {k: v for k, v in geometries().items() if k in ("A100-40GB", "H100-80GB", "A30-24GB")}
    loads = [float(x) for x in args.loads.split(",")]
    print(f"churn on {GPUS}-GPU nodes, {args.events} requests x {args.seeds} seeds per load")
    print(
        f"{'model':<11} {'load':>5} {'policy':<14} {'rejected':>9} {'frag':>6} "
        f"{'rej/planner':>12} {'frag/planner':>13}"
    )
    for label, geometry in models.items():
        for load in loads:
            results: dict[str, list[tuple[float, float]]] = {
                "planner order": [],
                "any placement": [],
            }
            for seed in range(args.seeds):
                events = trace(geometry, load, args.events, seed)
                for policy in results:
                    results[policy].append(churn(geometry, events, policy, seed))
            base_rej = statistics.fmean(r for r, _ in results["planner order"])
            base_frag = statistics.fmean(f for _, f in results["planner order"])
            for policy, rows in results.items():
                rej = statistics.fmean(r for r, _ in rows)
                frag = statistics.fmean(f for _, f in rows)
                print(
                    f"{label:<11} {load:5.1f} {policy:<14} {rej:9.3f} {frag:6.3f} "
                    f"{rej / base_rej if base_rej else float('nan'):12.2f} "
                    f"{frag / base_frag if base_frag else float('nan'):13.2f}"
                )


if __name__ == "__main__":
    main()
