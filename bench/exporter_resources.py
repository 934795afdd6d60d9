"""Agent CPU (% of one core) and RSS at a 1 s sample interval on dgx-h100, 56 MIG, 300 pods.

    .venv/bin/python bench/exporter_resources.py [--seconds 60] [--scrape-interval 15]
                                                 [--only agent|breakdown] [--threads]

``agent`` (the issue's measure): the whole agent, ``nodeagent run`` in a subprocess with every
component on: the sampler at 1 s, the MIG reconciler holding ``all-1g.10gb`` (the 56 instances
already exist, so it watches rather than changes), health, the device plugin (``mixed``, every
MIG device time-sliced into 6 replicas: 336 devices) registered with a test kubelet that keeps
its ListAndWatch stream open, and metrics with pod attribution polling a pod-resources server
with 300 pods every 10 s. Prometheus is played by a scrape every 15 s with gzip.

``breakdown``: the exporter's share alone, as measured before: a child process running only
the sampler, the metrics component and the pod-resources poller.

In both, the test kubelet and the pod-resources server run in this parent process, so their
cost is not counted; psutil measures the child over the window after a warm-up.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
from exporter_node import PODS, REPLICAS, mig_node, start_kubelet
from prometheus_client.parser import text_string_to_metric_families

from nodeagent.agent.backend import open_node
from nodeagent.agent.sampler import Sampler
from nodeagent.config.metrics import MetricsSection
from nodeagent.config.schema import AgentConfig, SamplerSection
from nodeagent.gpu.node import GpuNode
from nodeagent.runtime.snapshots import SnapshotStore
from nodeagent.testing.kubelet import TestKubelet
from nodeagent_exporters.component import SCRAPES_KEPT, MetricsExporter, build

MIG_RESOURCE = "nvidia.com/mig-1g.10gb"
WARM_UP_S = 5.0

AGENT_CONFIG = """\
version: v1
state_dir: {root}/agent
sampler: {{interval_s: 1}}
mig: {{enabled: true, allow_reset: true}}
health: {{enabled: true}}
device_plugin:
  enabled: true
  kubelet_dir: {root}/kubelet
  mig_strategy: mixed
  health_recovery_quiet_s: 60
metrics:
  enabled: true
  address: 127.0.0.1:{port}
  pod_attribution: true
  pod_resources_socket: {root}/pod-resources.sock
  pod_resources_interval_s: 10
pools:
  default:
    mig_layout: all-1g.10gb
    sharing: {{mode: time-slicing, replicas: {replicas}}}
"""


def free_port() -> int:
    """A loopback port nobody listens on now (the agent binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(port: int, path: str, gzip: bool = False) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path, headers={"Accept-Encoding": "gzip"} if gzip else {})
    resp = conn.getresponse()
    out = resp.status, resp.read()
    conn.close()
    return out


def nodeagent_command() -> list[str]:
    """``nodeagent`` as installed next to this interpreter (what an operator runs)."""
    script = Path(sys.executable).parent / "nodeagent"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from nodeagent.cli.main import main; main()"]


# ``--threads``: the child is nodeagent's CLI entry point, as the console script calls it, plus
# one thread that writes the Python thread names by native ID once (Python 3.11 does not name
# OS threads, so the parent could not tell them apart). It then exits; it costs nothing after.
THREAD_NAMES = """
import json, os, sys, threading, time
from nodeagent.cli.main import main
def dump():
    time.sleep(float(os.environ["NODEAGENT_BENCH_NAMES_AFTER_S"]))
    names = {t.native_id: t.name for t in threading.enumerate()}
    with open(os.environ["NODEAGENT_BENCH_NAMES"], "w") as f:
        json.dump(names, f)
threading.Thread(target=dump, daemon=True).start()
sys.argv[0] = "nodeagent"
sys.exit(main())
"""


def thread_times(proc: psutil.Process) -> dict[int, float]:
    """CPU seconds per native thread ID."""
    return {t.id: t.user_time + t.system_time for t in proc.threads()}


def measure(
    child: subprocess.Popen[bytes],
    port: int,
    seconds: float,
    scrape_interval: float,
    names_file: Path | None = None,
) -> tuple[float, float, int, dict[str, float]]:
    """CPU % of one core and max RSS (MiB) of ``child`` over the window, scrapes done in it,
    and with ``names_file`` the CPU % per thread name.

    Scrapes start at once, as Prometheus scrapes a target from the moment it is up; the window
    starts after a warm-up (imports, first renders, registration, the first kubelet poll) of
    as many regular scrapes as the agent keeps to learn the cadence it renders ahead for, so
    that the benchmark's own checks (ad-hoc scrapes) have left its memory.
    """
    proc = psutil.Process(child.pid)
    started = time.monotonic()
    window_starts = started + WARM_UP_S + SCRAPES_KEPT * scrape_interval
    threads0: dict[int, float] = {}
    cpu0 = proc.cpu_times()
    wall0 = window_starts
    scrapes, max_rss = 0, 0
    next_scrape = started
    in_window = False
    while time.monotonic() - window_starts < seconds:
        if child.poll() is not None:
            raise SystemExit(f"the agent exited with {child.returncode} during the window")
        if not in_window and time.monotonic() >= window_starts:
            in_window = True
            threads0 = thread_times(proc)
            cpu0, wall0 = proc.cpu_times(), time.monotonic()
        if time.monotonic() >= next_scrape:
            status, body = get(port, "/metrics", gzip=True)
            assert status == 200, status
            assert body
            scrapes += int(in_window)
            next_scrape += scrape_interval
        if in_window:
            max_rss = max(max_rss, proc.memory_info().rss)
        time.sleep(0.5)
    cpu1, wall1 = proc.cpu_times(), time.monotonic()
    threads1 = thread_times(proc)
    used = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    per_thread: dict[str, float] = {}
    if names_file is not None:
        names = {int(k): v for k, v in json.loads(names_file.read_text()).items()}
        for tid, spent in threads1.items():
            # gRPC's C-core threads have no Python name.
            name = names.get(tid, "grpc (native)")
            share = 100.0 * (spent - threads0.get(tid, 0.0)) / (wall1 - wall0)
            per_thread[name] = per_thread.get(name, 0.0) + share
    return 100.0 * used / (wall1 - wall0), max_rss / 2**20, scrapes, per_thread


def wait_ready(child: subprocess.Popen[bytes], port: int, timeout_s: float = 60.0) -> None:
    """Until ``/readyz`` answers 200: every component up, the plugin registered."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise SystemExit(f"the agent exited with {child.returncode} before it was ready")
        try:
            if get(port, "/readyz")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"the agent was not ready within {timeout_s:.0f} s")


def check_work(port: int, kubelet: TestKubelet, timeout_s: float = 10.0) -> str:
    """Evidence that every component does its job (else the number is cheap), retried until a
    render shows it: the plugin may register just after a snapshot was rendered."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return _check_work(port, kubelet)
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _check_work(port: int, kubelet: TestKubelet) -> str:
    devices = kubelet.wait_devices(MIG_RESOURCE, lambda d: len(d) == 56 * REPLICAS, 10.0)
    text = get(port, "/metrics")[1].decode()
    series: dict[str, int] = {}
    values: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            series[s.name] = series.get(s.name, 0) + 1
            values[(s.name, s.labels.get("resource", ""))] = s.value
    advertised = values.get(("nodeagent_device_plugin_devices_advertised", MIG_RESOURCE))
    allocated = values.get(("nodeagent_device_plugin_devices_allocated", MIG_RESOURCE))
    pods = series.get("nodeagent_device_plugin_pod_devices", 0)
    health = series.get("nodeagent_gpu_health_state", 0)
    instances = series.get("nodeagent_mig_instance_info", 0)
    problems = []
    if advertised != 56 * REPLICAS or allocated != PODS or pods != PODS:
        problems.append(f"plugin/attribution: {advertised=} {allocated=} {pods=}")
    if health == 0 or instances != 56:
        problems.append(f"health/MIG: {health=} {instances=}")
    if problems:
        raise AssertionError("the agent did not do the expected work: " + "; ".join(problems))
    return (
        f"kubelet sees {len(devices)} devices; metrics: {advertised:.0f} advertised, "
        f"{allocated:.0f} allocated, {pods} pod series, {instances} MIG instances, "
        f"{health} health-state series"
    )


@dataclass
class RunningAgent:
    """``nodeagent run`` on a simulated dgx-h100 with the test kubelet and pod-resources."""

    child: subprocess.Popen[bytes]
    port: int
    kubelet: TestKubelet
    names_file: Path | None  # where the thread names land (``threads``), else None


@contextmanager
def running_agent(
    *,
    threads: bool = False,
    proc_root: bool = False,
    prepare: Callable[[GpuNode, Path], object] | None = None,
    launcher: list[str] | None = None,
) -> Iterator[RunningAgent]:
    """The whole agent with every component (``AGENT_CONFIG``), ready, stopped on exit.

    ``prepare(node, root)`` runs on the simulated node before the agent starts; ``proc_root``
    points process attribution at ``root/proc`` (cgroup files a bench writes); ``threads``
    records the thread names for :func:`measure`; ``launcher`` replaces the command before
    ``run`` (the CLI's arguments follow it). The agent's log tail is shown on failure.
    """
    root = Path(tempfile.mkdtemp(prefix="nab-"))  # short: unix socket paths are limited
    node = mig_node(root / "sim")
    (root / "proc").mkdir()
    if prepare is not None:
        prepare(node, root)
    pod_resources = start_kubelet(node, root / "pod-resources.sock")
    kubelet = TestKubelet(root / "kubelet")
    kubelet.start()
    port = free_port()
    config = AGENT_CONFIG.format(root=root, port=port, replicas=REPLICAS)
    if proc_root:
        config = config.replace(
            "  pod_resources_interval_s: 10\n",
            f"  pod_resources_interval_s: 10\n  proc_root: {root}/proc\n",
        )
    (root / "agent.yaml").write_text(config)
    names_file = root / "threads.json" if threads else None
    env = dict(os.environ)
    if names_file is not None:
        env["NODEAGENT_BENCH_NAMES"] = str(names_file)
        # Once every component's thread runs (ready within seconds), before the window ends.
        env["NODEAGENT_BENCH_NAMES_AFTER_S"] = str(4 * WARM_UP_S)
    if launcher is None:  # a bench may pass its own (one that patches the agent first)
        launcher = [sys.executable, "-c", THREAD_NAMES] if threads else nodeagent_command()
    command = [*launcher, "run", "--config", str(root / "agent.yaml"),
               "--simulate", "dgx-h100", "--state-dir", str(root / "sim"),
               "--log-level", "warning"]  # fmt: skip
    log = (root / "agent.log").open("wb")
    child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_ready(child, port)
        yield RunningAgent(child, port, kubelet, names_file)
    except BaseException:
        log.flush()
        sys.stderr.write((root / "agent.log").read_text()[-4000:])
        raise
    finally:
        child.terminate()
        child.wait(15)
        log.close()
        kubelet.stop()
        pod_resources.stop(None)
        node.close()
        shutil.rmtree(root, ignore_errors=True)


def add_window_arguments(parser: argparse.ArgumentParser, *, seconds: float) -> None:
    """``--seconds`` (the measured window) and ``--threads``, for whole-agent benchmarks."""
    parser.add_argument("--seconds", type=float, default=seconds, help="measured window")
    parser.add_argument(
        "--threads", action="store_true", help="also split the agent's CPU by thread"
    )


def print_threads(per_thread: dict[str, float]) -> None:
    """The CPU % per thread name, largest first."""
    for name, share in sorted(per_thread.items(), key=lambda kv: -kv[1]):
        print(f"    {name:26} {share:8.2f}")


def run_agent(seconds: float, scrape_interval: float, threads: bool) -> None:
    """The whole agent: ``nodeagent run`` with every component, in a subprocess."""
    with running_agent(threads=threads) as agent:
        print("whole agent: nodeagent run, every component enabled")
        print("  " + check_work(agent.port, agent.kubelet))
        pct, rss, scrapes, per_thread = measure(
            agent.child, agent.port, seconds, scrape_interval, agent.names_file
        )
        count = psutil.Process(agent.child.pid).num_threads()
        print("  " + check_work(agent.port, agent.kubelet))
        print(f"  window {seconds:.0f} s, {scrapes} scrapes every {scrape_interval:g} s")
        print(f"  {'agent CPU (% of one core)':28} {pct:8.2f}")
        print(f"  {'agent RSS max (MiB)':28} {rss:8.1f}")
        print(f"  {'threads':28} {count:8d}")
        print_threads(per_thread)


def breakdown_child(state_dir: Path, socket_path: Path, port: int) -> None:
    """The breakdown child: sampler at 1 s plus the metrics component and poller, until killed."""
    node = open_node(simulate="dgx-h100", state_dir=state_dir)
    config = AgentConfig(
        sampler=SamplerSection(interval_s=1.0),
        metrics=MetricsSection(address=f"127.0.0.1:{port}", pod_resources_socket=socket_path),
    )
    snapshots = SnapshotStore()
    exporter = build(config, snapshots)
    assert isinstance(exporter, MetricsExporter)
    stop = threading.Event()
    sampler = Sampler(node, snapshots, config.sampler)
    threading.Thread(target=sampler.run, args=(stop,), daemon=True).start()
    exporter.run(stop)


def run_breakdown(seconds: float, scrape_interval: float) -> None:
    """Only the sampler, the metrics component and the poller, in a child process."""
    root = Path(tempfile.mkdtemp(prefix="nab-"))
    node = mig_node(root / "sim")
    pod_resources = start_kubelet(node, root / "pod-resources.sock")
    port = free_port()
    args = ["--breakdown-child", str(root / "sim"), str(root / "pod-resources.sock"), str(port)]
    child = subprocess.Popen([sys.executable, __file__, *args])
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if get(port, "/metrics")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or child.poll() is not None:
                raise SystemExit("the breakdown child did not start")
            time.sleep(0.2)
        pct, rss, scrapes, _ = measure(child, port, seconds, scrape_interval)
        print("breakdown: sampler + metrics + pod-resources poller only")
        print(f"  window {seconds:.0f} s, {scrapes} scrapes every {scrape_interval:g} s")
        print(f"  {'CPU (% of one core)':28} {pct:8.2f}")
        print(f"  {'RSS max (MiB)':28} {rss:8.1f}")
    finally:
        child.terminate()
        child.wait(10)
        pod_resources.stop(None)
        node.close()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_window_arguments(parser, seconds=60.0)
    parser.add_argument("--scrape-interval", type=float, default=15.0)
    parser.add_argument("--only", choices=("agent", "breakdown"))
    parser.add_argument("--breakdown-child", nargs=3, metavar=("STATE", "SOCKET", "PORT"))
    args = parser.parse_args()
    if args.breakdown_child:
        state, sock, port = args.breakdown_child
        breakdown_child(Path(state), Path(sock), int(port))
        return
    if args.only in (None, "agent"):
        run_agent(args.seconds, args.scrape_interval, args.threads)
    if args.only in (None, "breakdown"):
        run_breakdown(args.seconds, args.scrape_interval)


if __name__ == "__main__":
    main()
