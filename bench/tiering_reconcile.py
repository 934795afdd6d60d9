"""Tiering service at scale: 5,000 nodes and 50,000 pods in the API stand-in.

Measures, with the stand-in in its own process (so its memory is not counted):

- the initial list into the watch-driven node cache, and the first pass (labels every node);
- steady-state full reconcile passes (plan over all nodes, nothing to write): median and p99
  of ``--passes`` passes -- target < 1 s;
- the service's RSS after all of that -- target < 300 MB;
- time from a node's stability label turning ``unstable`` (a PATCH from another client) to
  the node being cordoned, with the real event-driven loop running: median and p99 of
  ``--cordons`` samples -- target < 2 s. After each sample the label goes back to what it was
  and the bench waits for the service to return the node (``recovery_period_s`` is 0 here), so
  every sample starts from one quiet cluster with no drain running and no budget in the way;
- baseline, same run: listing the 5,000 nodes through the client's generated models, which is
  what the raw-JSON cache avoids (median of 3, as is the cache list).

Run: ``.venv/bin/python bench/tiering_reconcile.py [--nodes 5000] [--pods 50000]
[--passes 200] [--cordons 200]`` (about 2 minutes on a 2-core VM).
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import psutil

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # the API stand-in lives in tests/

from nodeagent import labels as lbl  # noqa: E402
from nodeagent_tiering.clock import SystemClock  # noqa: E402
from nodeagent_tiering.controller import Controller  # noqa: E402
from nodeagent_tiering.kube import Kube, NodeCache, api_client  # noqa: E402
from nodeagent_tiering.policy import parse_policy  # noqa: E402

T = TypeVar("T")

POLICY = {
    "version": "v1",
    "tiers": [
        {
            "name": "training",
            "selector": {
                "match_labels": {lbl.NVLINK_LARGEST_SET: "8"},
                "match_expressions": [
                    {"key": lbl.GPU_PRODUCT, "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}
                ],
            },
            "stability": ["stable"],
            "min_healthy": "50%",
            "max_draining": "10%",
        },
        {"name": "general", "selector": {"match_labels": {lbl.GPU_COUNT: "8"}}},
        {"name": "shared"},
    ],
    "budget": {"max_draining": 50, "cooldown_s": 0},
    # Nodes return as soon as they are stable again, so each latency sample starts clean.
    "recovery_period_s": 0,
    "breaker": {"percentage": 50, "window_s": 300},
}


def start_standin(nodes: int, pods: int) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.kubeapi", "--nodes", str(nodes), "--pods", str(pods)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    if not url.startswith("http://"):
        proc.kill()
        raise SystemExit(f"the stand-in did not start: {url!r}")
    return proc, url


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    """Seconds ``fn`` took, and what it returned."""
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def p99(samples: list[float]) -> float:
    """The nearest-rank 99th percentile (the 198th of 200 sorted samples)."""
    ordered = sorted(samples)
    return ordered[max(math.ceil(0.99 * len(ordered)) - 1, 0)]


def wait_for(
    kube: Kube, name: str, unschedulable: bool, start: float, limit_s: float = 10.0
) -> float:
    """Poll the node until ``spec.unschedulable`` is as asked; seconds since ``start`` (capped)."""
    while time.perf_counter() - start < limit_s:
        # The raw response (no model decoding): its ``data`` is the JSON body.
        data: bytes = kube.core.read_node(name, _preload_content=False).data  # type: ignore[attr-defined]
        if (b'"unschedulable":true' in data) == unschedulable:
            break
        time.sleep(0.005)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=50000)
    parser.add_argument("--passes", type=int, default=200)
    parser.add_argument("--cordons", type=int, default=200)
    args = parser.parse_args()

    wall = time.perf_counter()
    t0 = time.perf_counter()
    proc, url = start_standin(args.nodes, args.pods)
    populate_s = time.perf_counter() - t0
    try:
        kube = Kube(api_client(server=url))
        policy = parse_policy(POLICY)

        baseline_s = statistics.median(timed(lambda: kube.core.list_node())[0] for _ in range(3))
        cache = NodeCache(kube)
        list_s = statistics.median(timed(cache.relist)[0] for _ in range(3))
        ctl = Controller(kube, cache, policy, clock=SystemClock())
        first_s, first = timed(ctl.reconcile_once)
        cache.relist()
        passes = []
        for _ in range(args.passes):
            seconds, steady = timed(ctl.reconcile_once)
            passes.append(seconds)
            assert not steady.actions, "steady state must have nothing to do"
        rss_mb = psutil.Process().memory_info().rss / 2**20

        # Event-driven latency: the real loop runs; another client flips a node to unstable.
        stop = threading.Event()
        loop = threading.Thread(target=ctl.run, args=(stop,), daemon=True)
        loop.start()
        time.sleep(1.0)  # let the informer start watching
        other = Kube(api_client(server=url))
        latencies = []
        returns = []
        for i in range(args.cordons):
            name = f"node-{(i * 97) % args.nodes:05d}"
            start = time.perf_counter()
            other.patch_node(name, {"metadata": {"labels": {lbl.STABILITY: "unstable"}}})
            latencies.append(wait_for(other, name, unschedulable=True, start=start))
            # Put the node back (the stand-in populates every node stable) and wait until the
            # service has returned it, so the next sample starts with no drain running.
            start = time.perf_counter()
            other.patch_node(name, {"metadata": {"labels": {lbl.STABILITY: "stable"}}})
            returns.append(wait_for(other, name, unschedulable=False, start=start))
        stop.set()
        loop.join(timeout=10)
        rss_after_mb = psutil.Process().memory_info().rss / 2**20
    finally:
        proc.kill()
        proc.wait()

    n_pass, n_cordon = len(passes), len(latencies)
    rows = [
        ("stand-in populate (separate process)", f"{populate_s:.1f} s", ""),
        ("baseline: list nodes via client models (median of 3)", f"{baseline_s:.2f} s", ""),
        ("initial list into the raw-JSON cache (median of 3)", f"{list_s:.2f} s", ""),
        (f"first pass ({len(first.actions)} label writes)", f"{first_s:.2f} s", ""),
        (
            f"steady full reconcile pass, median of {n_pass}",
            f"{statistics.median(passes):.3f} s",
            "< 1 s",
        ),
        (f"steady full reconcile pass, p99 of {n_pass}", f"{p99(passes):.3f} s", "< 1 s"),
        (f"steady full reconcile pass, worst of {n_pass}", f"{max(passes):.3f} s", "< 1 s"),
        ("RSS after passes", f"{rss_mb:.0f} MB", "< 300 MB"),
        ("RSS after the cordon runs", f"{rss_after_mb:.0f} MB", "< 300 MB"),
        (
            f"unstable -> cordon, median of {n_cordon}",
            f"{statistics.median(latencies):.3f} s",
            "< 2 s",
        ),
        (f"unstable -> cordon, p99 of {n_cordon}", f"{p99(latencies):.3f} s", "< 2 s"),
        (f"unstable -> cordon, worst of {n_cordon}", f"{max(latencies):.3f} s", "< 2 s"),
        (
            f"stable again -> returned, median of {len(returns)}",
            f"{statistics.median(returns):.3f} s",
            "",
        ),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"tiering at {args.nodes} nodes, {args.pods} pods")
    for name, value, target in rows:
        print(f"  {name.ljust(width)}  {value:>10}  {target}".rstrip())
    print(f"  (bench wall time {time.perf_counter() - wall:.0f} s)")


if __name__ == "__main__":
    main()
