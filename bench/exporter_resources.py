"""Agent CPU (% of one core) and RSS at a 1 s sample interval on dgx-h100, 56 MIG, 300 pods.

    .venv/bin/python bench/exporter_resources.py [--seconds 60] [--scrape-interval 15]

Runs the sampler, the metrics component and the pod-resources poller (10 s) in a child
process, scrapes it like Prometheus would, and measures the child with psutil over the window
(after a warm-up). The fake kubelet runs in this parent process, so its cost is not counted.
"""

from __future__ import annotations

import argparse
import http.client
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
from exporter_node import mig_node, start_kubelet

from exporters.component import MetricsExporter, build_component
from nodeagent.agent.component import AgentContext
from nodeagent.agent.sampler import Sampler
from nodeagent.config.metrics import MetricsSection
from nodeagent.config.schema import AgentConfig, SamplerSection
from nodeagent.gpu.node import open_node


def agent(state_dir: Path, socket_path: Path, port_file: Path) -> None:
    """The child: sampler at 1 s plus the metrics component, until killed."""
    node = open_node(simulate="dgx-h100", state_dir=state_dir)
    config = AgentConfig(
        sampler=SamplerSection(interval_s=1.0),
        metrics=MetricsSection(address="127.0.0.1:0", pod_resources_socket=socket_path),
    )
    ctx = AgentContext(config=config, node=node, state_dir=state_dir / "agent")
    exporter = build_component(ctx)
    assert isinstance(exporter, MetricsExporter)
    stop = threading.Event()
    sampler = Sampler(node, ctx.snapshots, config.sampler.interval_s)
    threading.Thread(target=sampler.run, args=(stop,), daemon=True).start()
    threading.Thread(target=exporter.run, args=(stop,), daemon=True).start()
    while not exporter.ready:
        time.sleep(0.05)
    assert exporter.server is not None
    port_file.write_text(str(exporter.server.port))
    stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--scrape-interval", type=float, default=15.0)
    parser.add_argument("--agent", nargs=3, metavar=("STATE", "SOCKET", "PORTFILE"))
    args = parser.parse_args()
    if args.agent:
        agent(Path(args.agent[0]), Path(args.agent[1]), Path(args.agent[2]))
        return

    tmp = Path(tempfile.mkdtemp(prefix="nodeagent-bench-"))
    node = mig_node(tmp / "sim")
    kubelet = start_kubelet(node, tmp / "kubelet.sock")
    port_file = tmp / "port"
    child = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--agent",
            str(tmp / "sim"),
            str(tmp / "kubelet.sock"),
            str(port_file),
        ]
    )
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            if time.monotonic() > deadline or child.poll() is not None:
                raise SystemExit("the agent child did not start")
            time.sleep(0.1)
        port = int(port_file.read_text())
        proc = psutil.Process(child.pid)
        time.sleep(5)  # warm-up: imports, first renders, first kubelet poll
        cpu0, wall0 = proc.cpu_times(), time.monotonic()
        scrapes, max_rss = 0, 0
        next_scrape = wall0
        while time.monotonic() - wall0 < args.seconds:
            if time.monotonic() >= next_scrape:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
                assert conn.getresponse().read()
                conn.close()
                scrapes += 1
                next_scrape += args.scrape_interval
            max_rss = max(max_rss, proc.memory_info().rss)
            time.sleep(0.5)
        cpu1, wall1 = proc.cpu_times(), time.monotonic()
        used = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
        pct = 100.0 * used / (wall1 - wall0)
        print(f"window {wall1 - wall0:.0f} s, {scrapes} scrapes every {args.scrape_interval:g} s")
        print(f"{'agent CPU (% of one core)':28} {pct:8.2f}")
        print(f"{'agent RSS max (MiB)':28} {max_rss / 2**20:8.1f}")
    finally:
        child.terminate()
        child.wait(10)
        kubelet.stop(None)
        node.close()


if __name__ == "__main__":
    main()
