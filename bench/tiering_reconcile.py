"""Tiering service at scale: 5,000 nodes and 50,000 pods in the API stand-in.

Measures, with the stand-in in its own process (so its memory is not counted):

- the initial list into the watch-driven node cache, and the first pass (labels every node);
- a steady-state full reconcile pass (plan over all nodes, nothing to write) -- target < 1 s;
- the service's RSS after all of that -- target < 300 MB;
- time from a node's stability label turning ``unstable`` (a PATCH from another client) to
  the node being cordoned, with the real event-driven loop running -- target < 2 s;
- baseline, same run: listing the 5,000 nodes through the client's generated models, which is
  what the raw-JSON cache avoids.

Run: ``.venv/bin/python bench/tiering_reconcile.py [--nodes 5000] [--pods 50000]``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # the API stand-in lives in tests/

from nodeagent import labels as lbl  # noqa: E402
from tiering.clock import SystemClock  # noqa: E402
from tiering.controller import Controller  # noqa: E402
from tiering.kube import Kube, NodeCache, api_client  # noqa: E402
from tiering.policy import parse_policy  # noqa: E402

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


def timed(fn):  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=50000)
    parser.add_argument("--cordons", type=int, default=10)
    args = parser.parse_args()

    t0 = time.perf_counter()
    proc, url = start_standin(args.nodes, args.pods)
    populate_s = time.perf_counter() - t0
    try:
        kube = Kube(api_client(server=url))
        policy = parse_policy(POLICY)

        baseline_s, _ = timed(lambda: kube.core.list_node())
        cache = NodeCache(kube)
        list_s, _ = timed(cache.relist)
        ctl = Controller(kube, cache, policy, clock=SystemClock())
        first_s, first = timed(ctl.reconcile_once)
        cache.relist()
        passes = []
        for _ in range(5):
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
        for i in range(args.cordons):
            name = f"node-{(i * 97) % args.nodes:05d}"
            start = time.perf_counter()
            other.patch_node(name, {"metadata": {"labels": {lbl.STABILITY: "unstable"}}})
            while time.perf_counter() - start < 10:
                node = other.core.read_node(name, _preload_content=False)
                if b'"unschedulable":true' in node.data:
                    break
                time.sleep(0.005)
            latencies.append(time.perf_counter() - start)
        stop.set()
        loop.join(timeout=10)
        rss_after_mb = psutil.Process().memory_info().rss / 2**20
    finally:
        proc.kill()
        proc.wait()

    rows = [
        ("stand-in populate (separate process)", f"{populate_s:.1f} s", ""),
        ("baseline: list nodes via client models", f"{baseline_s:.2f} s", ""),
        ("initial list into the raw-JSON cache", f"{list_s:.2f} s", ""),
        (f"first pass ({len(first.actions)} label writes)", f"{first_s:.2f} s", ""),
        ("steady full reconcile pass (median of 5)", f"{statistics.median(passes):.3f} s", "< 1 s"),
        ("RSS after passes", f"{rss_mb:.0f} MB", "< 300 MB"),
        ("RSS after the cordon runs", f"{rss_after_mb:.0f} MB", "< 300 MB"),
        (
            f"unstable -> cordon, median of {len(latencies)}",
            f"{statistics.median(latencies):.3f} s",
            "< 2 s",
        ),
        ("unstable -> cordon, worst", f"{max(latencies):.3f} s", "< 2 s"),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"tiering at {args.nodes} nodes, {args.pods} pods")
    for name, value, target in rows:
        print(f"  {name.ljust(width)}  {value:>10}  {target}")


if __name__ == "__main__":
    main()
