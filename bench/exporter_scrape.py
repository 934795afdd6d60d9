"""Scrape latency and size: pre-rendered snapshot vs collect-on-scrape, same code, same run.

    .venv/bin/python bench/exporter_scrape.py [--requests 400] [--concurrency 1 20] [--no-peer]

Node: dgx-h100, 56 MIG instances, 300 pods (see exporter_node.py). "served" is the agent's
design: the sampler renders each snapshot once and a scrape writes bytes; "compat" is the same
with ``metrics.dcgm_compat`` on (dcgm-exporter's families appended to every render), and the
run also prints the render time of fresh snapshots with the view off and on. "collect" is the
baseline many exporters use: every scrape samples NVML, polls the kubelet and renders, through
the very same functions. "peer" is a third-party pynvml exporter, nvitop-exporter (pinned in the
dev extras), run unmodified on the same simulated node through ``nodeagent sim exec``: it
samples in a background loop (1 s) and renders its registry on every scrape.
"""

from __future__ import annotations

import argparse
import http.client
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from exporter_node import PODS, mig_node, start_kubelet

from nodeagent.config.pool_policy import PoolPolicy
from nodeagent.gpu.node import GpuNode
from nodeagent.gpu.types import NodeSnapshot
from nodeagent_exporters.podresources import PodResourcesPoller
from nodeagent_exporters.render import Rendered, Renderer, Sources
from nodeagent_exporters.server import MetricsServer


def scrape_many(port: int, scrapers: int, per_scraper: int, gzip: bool) -> tuple[list[float], int]:
    """Latencies (s) of every request from ``scrapers`` keep-alive clients, and the body size."""
    latencies: list[float] = []
    sizes: list[int] = []
    lock = threading.Lock()
    headers = {"Accept-Encoding": "gzip"} if gzip else {}

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        mine = []
        for _ in range(per_scraper):
            t0 = time.perf_counter()
            conn.request("GET", "/metrics", headers=headers)
            resp = conn.getresponse()
            body = resp.read()
            mine.append(time.perf_counter() - t0)
            assert resp.status == 200
        conn.close()
        with lock:
            latencies.extend(mine)
            sizes.append(len(body))

    threads = [threading.Thread(target=client) for _ in range(scrapers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, max(sizes)


def start_peer(state_dir: Path) -> tuple[subprocess.Popen[bytes], int]:
    """nvitop-exporter on the simulated node in ``state_dir``; returns it once it serves."""
    with socket.socket() as probe:  # a free loopback port for the exporter
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    env = dict(os.environ, NODEAGENT_SIM_STATE=str(state_dir))
    nodeagent = str(Path(sys.executable).parent / "nodeagent")
    command = [nodeagent, "sim", "exec", "--", "nvitop-exporter", "--bind-address", "127.0.0.1",
               "--port", str(port), "--hostname", "bench", "--interval", "1"]  # fmt: skip
    log = state_dir.parent / "nvitop-exporter.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until its first collection is in the registry
        if proc.poll() is not None:
            raise SystemExit(f"nvitop-exporter exited; see {log}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/metrics")
            body = conn.getresponse().read()
            conn.close()
            if b"gpu_memory_used" in body:
                return proc, port
        except OSError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"nvitop-exporter did not serve within 60 s; see {log}")


def render_costs(
    plain: Renderer, compat: Renderer, snapshots: list[NodeSnapshot]
) -> dict[str, tuple[float, float]]:
    """Median and worst render time (ms) of fresh snapshots, dcgm-exporter view off and on:
    what a scrape off the cadence adds, and what the view adds to every render."""
    out = {}
    for name, renderer in (("compat off", plain), ("compat on", compat)):
        times = []
        for snap in snapshots:
            t0 = time.perf_counter()
            renderer.render(snap)
            times.append((time.perf_counter() - t0) * 1e3)
        out[name] = (statistics.median(times), max(times))
    return out


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=400, help="requests per configuration")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 20])
    parser.add_argument("--no-peer", action="store_true", help="skip nvitop-exporter")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="nodeagent-bench-"))
    node: GpuNode = mig_node(tmp / "sim")
    kubelet = start_kubelet(node, tmp / "kubelet.sock")
    poller = PodResourcesPoller(tmp / "kubelet.sock", 10.0)
    poller.poll()
    renderer = Renderer(
        Sources(
            policy=lambda: PoolPolicy(request_sizes=("1g.10gb", "3g.40gb", "gpu")),
            allocations=lambda: poller.latest,
        )
    )
    # GPM figures come from two samples: a first pass, so the served snapshot carries them.
    node.snapshot()
    time.sleep(0.2)
    snapshot = node.snapshot()
    served = renderer.render(snapshot)
    # The same inputs with the dcgm-exporter view on (its Hostname label: a node name).
    compat_renderer = Renderer(replace(renderer.sources, dcgm_compat=lambda: "gpu-node-1"))
    compat_served = compat_renderer.render(snapshot)
    render_ms = render_costs(renderer, compat_renderer, [node.snapshot() for _ in range(20)])
    mig = sum(len(g.mig_instances) for g in snapshot.gpus)
    print(
        f"node: dgx-h100, {mig} MIG instances, {PODS} pods; body {len(served.body)} bytes, "
        f"gzip {len(served.gzipped)} bytes"
    )

    def collect() -> Rendered:
        poller.poll()
        return renderer.render(node.snapshot())

    modes: dict[str, Callable[[], Rendered | None]] = {
        "served": lambda: served,
        "compat": lambda: compat_served,
        "collect": collect,
    }
    rows = []
    for mode, body in modes.items():
        server = MetricsServer("127.0.0.1:0", body, lambda: True)
        server.start()
        try:
            for scrapers in args.concurrency:
                for gz in (False, True):
                    # Collect-on-scrape is slow: fewer requests keep the run short.
                    total = args.requests if mode != "collect" else max(40, args.requests // 10)
                    per = max(1, total // scrapers)
                    scrape_many(server.port, scrapers, 2, gz)  # warm-up
                    lat, size = scrape_many(server.port, scrapers, per, gz)
                    rows.append(
                        (
                            mode,
                            scrapers,
                            "gzip" if gz else "plain",
                            len(lat),
                            statistics.median(lat) * 1e3,
                            p99(lat) * 1e3,
                            size,
                        )
                    )
        finally:
            server.stop()
    if not args.no_peer:
        peer, port = start_peer(tmp / "sim")
        try:
            for scrapers in args.concurrency:
                for gz in (False, True):
                    per = max(1, args.requests // scrapers)
                    scrape_many(port, scrapers, 2, gz)  # warm-up
                    lat, size = scrape_many(port, scrapers, per, gz)
                    rows.append(
                        ("peer", scrapers, "gzip" if gz else "plain", len(lat),
                         statistics.median(lat) * 1e3, p99(lat) * 1e3, size)
                    )  # fmt: skip
        finally:
            peer.terminate()
            peer.wait(timeout=30)
    kubelet.stop(None)
    node.close()
    print(
        f"{'mode':8} {'scrapers':>8} {'encoding':>8} {'requests':>8} {'median ms':>10} "
        f"{'p99 ms':>8} {'bytes':>8}"
    )
    for mode, scrapers, enc, n, med, p, size in rows:
        print(f"{mode:8} {scrapers:>8} {enc:>8} {n:>8} {med:>10.2f} {p:>8.2f} {size:>8}")
    for name, (median, worst) in render_ms.items():
        print(f"render, {name}: median {median:.2f} ms, max {worst:.2f} ms (20 snapshots)")
    served_rows = {(r[1], r[2]): r for r in rows if r[0] == "served"}
    for mode, scrapers, enc, _, med, p, _ in rows:
        if mode == "peer" and (scrapers, enc) in served_rows:
            base = served_rows[(scrapers, enc)]
            print(
                f"peer / served, {scrapers} scrapers {enc}: median {med / base[4]:.1f}x, "
                f"p99 {p / base[5]:.1f}x"
            )


if __name__ == "__main__":
    main()
