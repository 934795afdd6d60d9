"""Agent CPU and memory while idle and during an XID storm (1,000 events in 10 s).

Run: ``python bench/health_storm.py [--events 1000] [--seconds 10]``. Prints a table.

The agent (sampler at 1 s + health component + reporter) runs in this process. The control plane
it flags its node on (etcd and kube-apiserver from ``make kube-bins``, with the scheduler and the
controller manager) runs from a subprocess (``python -m nodeagent.testing.kube``) and a second
subprocess injects the XIDs through the simulator's control API, so the CPU and RSS measured here
are the agent's alone; kube-apiserver's and etcd's CPU is printed beside them for reference.
Phases: idle (baseline, same run), storm, and after. Checks that every injected XID is counted
(per GPU and code) and that RSS stays flat.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil
from health_common import cluster_process, print_table, start_agent

from nodeagent.config.health import HealthSection

CODES = (13, 31, 43, 94, 13, 31, 62, 48)  # mostly application XIDs, some fatal ones

INJECTOR = """
import sys, time
from nodeagent.sim.control import SimControl
state, events, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
codes = {codes}
control = SimControl(state)
start = time.monotonic()
for i in range(events):
    due = start + i * seconds / events
    delay = due - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    control.inject("xid", i % 8, code=codes[i % len(codes)])
print(f"{{time.monotonic() - start:.2f}}")
"""


def measure(proc: psutil.Process, seconds: float, until: object = None) -> tuple[float, list[int]]:
    """CPU percent of one core over the phase, and RSS samples every 0.25 s."""
    cpu0 = proc.cpu_times()
    t0 = time.monotonic()
    rss = []
    while time.monotonic() - t0 < seconds:
        rss.append(proc.memory_info().rss)
        time.sleep(0.25)
        if callable(until) and until():
            break
    cpu1 = proc.cpu_times()
    used = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    return 100 * used / (time.monotonic() - t0), rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--idle", type=float, default=10.0, help="idle phase length, seconds")
    args = parser.parse_args()
    proc = psutil.Process()
    cluster = cluster_process()
    assert cluster.process is not None
    servers = [
        c
        for c in psutil.Process(cluster.process.pid).children(recursive=True)
        if c.name() in ("kube-apiserver", "etcd")
    ]
    api_cpu0 = [c.cpu_times() for c in servers]
    api_t0 = time.monotonic()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            agent = start_agent(Path(tmp), HealthSection(), cluster)
            try:
                time.sleep(2)  # warm up: first samples, first patches
                idle_cpu, idle_rss = measure(proc, args.idle)
                expected: Counter[tuple[int, int]] = Counter(
                    (i % 8, CODES[i % len(CODES)]) for i in range(args.events)
                )
                index = {info.uuid: info.index for info in agent.node.inventory()}
                injector = subprocess.Popen(
                    [sys.executable, "-c", INJECTOR.format(codes=CODES), str(Path(tmp) / "sim"),
                     str(args.events), str(args.seconds)],
                    stdout=subprocess.PIPE, text=True,
                )  # fmt: skip

                def counted() -> int:
                    return agent.model.node_health().events_total.get("xid", 0)

                storm_cpu, storm_rss = measure(
                    proc, args.seconds + 5, until=lambda: injector.poll() is not None
                    and counted() >= args.events,
                )  # fmt: skip
                out, _ = injector.communicate(timeout=30)
                after_cpu, after_rss = measure(proc, 5)
                health = agent.model.node_health()
                got: Counter[tuple[int, int]] = Counter(
                    {(index[u], code): n for (u, code), n in health.xids_total.items()}
                )
                patches = agent.patches_sent
            finally:
                agent.close()
        api_cpu1 = [c.cpu_times() for c in servers]
        api_used = sum(
            (b.user - a.user) + (b.system - a.system)
            for a, b in zip(api_cpu0, api_cpu1, strict=True)
        )
        api_cpu = 100 * api_used / (time.monotonic() - api_t0)
    finally:
        cluster.close()
    mib = 1024 * 1024
    rows = [
        ["idle", f"{idle_cpu:.1f}", f"{idle_rss[0] / mib:.1f}", f"{idle_rss[-1] / mib:.1f}",
         f"{max(idle_rss) / mib:.1f}"],
        [f"storm ({args.events} XIDs in {out.strip()}s)", f"{storm_cpu:.1f}",
         f"{storm_rss[0] / mib:.1f}", f"{storm_rss[-1] / mib:.1f}", f"{max(storm_rss) / mib:.1f}"],
        ["after", f"{after_cpu:.1f}", f"{after_rss[0] / mib:.1f}", f"{after_rss[-1] / mib:.1f}",
         f"{max(after_rss) / mib:.1f}"],
    ]  # fmt: skip
    print_table(["phase", "cpu % of a core", "rss start MiB", "rss end MiB", "rss max MiB"], rows)
    lost = sum((expected - got).values())
    print(f"\nXIDs injected {args.events}, counted {sum(got.values())}, lost {lost}, "
          f"per (GPU, code) exact: {got == expected}; node patches sent: {patches}")  # fmt: skip
    growth = (max(after_rss) - idle_rss[0]) / mib
    print(f"RSS growth idle -> after: {growth:+.1f} MiB")
    print(f"kube-apiserver and etcd (separate processes, not counted above): {api_cpu:.1f} % of "
          "a core averaged over the run")  # fmt: skip


if __name__ == "__main__":
    main()
