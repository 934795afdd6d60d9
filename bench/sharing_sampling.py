"""Sampling cost of per-process usage and attribution: 300 processes, 8 GPUs, 56 MIG devices.

    .venv/bin/python bench/sharing_sampling.py [--seconds 30] [--rounds 40] [--only parts|agent]
                                               [--threads]

Node: dgx-h100 split into 56 ``1g.10gb`` instances, each time-sliced into 6 replicas, 300 pods
holding one replica each (``exporter_node.py``); here every pod also runs one compute process
(1 GiB) on its MIG device, with a cgroup file under a temporary proc root naming its pod.

``parts`` (in this process, medians and p99 over ``--rounds``): the snapshot (the sampler's
work) without processes (the baseline) and with the 300, per-process usage included; the
attribution of the 300 processes (cgroup files read once, then cached; the pod index given);
and the render with attribution on against off, in the same run.

``agent``: the whole agent, ``nodeagent run`` with every component on (as
``exporter_resources.py``: sampler at 1 s, MIG reconciler, health, device plugin with 336
devices and a test kubelet, metrics with pod attribution, a scrape every 15 s), with process
attribution reading the proc root, first without the processes (baseline), then with them.
CPU is % of one core over the window after a warm-up, RSS the maximum.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, __file__.rsplit("/", 1)[0])

from exporter_node import PODS, REPLICAS, mig_node
from exporter_resources import add_window_arguments, measure, print_threads, running_agent

from nodeagent.config.pool_policy import PoolPolicy
from nodeagent.gpu.node import GpuNode
from nodeagent.sim.control import SimControl
from nodeagent.workloads import CgroupReader, PodIndex, attribute
from nodeagent_exporters.podresources import PodDevice
from nodeagent_exporters.render import Renderer, Sources

MIB = 1024 * 1024


def uid(n: int) -> str:
    return f"{n:08x}-0000-0000-0000-000000000000"


def start_processes(node: GpuNode, state_dir: Path, proc_root: Path) -> list[PodDevice]:
    """One process per pod on the MIG device its replica is on; returns the holders."""
    uuids = [gi.uuid for g in range(node.count()) for gi in node.mig_instances(g) if gi.uuid]
    owner = {gi.uuid: g for g in range(node.count()) for gi in node.mig_instances(g)}
    control = SimControl(state_dir)
    holders = []
    for n in range(PODS):
        mig = uuids[n // REPLICAS]
        pid = control.add_process(owner[mig], mig_uuid=mig, used_memory_mib=1024, load=0.1)
        (proc_root / str(pid)).mkdir(parents=True)
        u = uid(n).replace("-", "_")
        (proc_root / str(pid) / "cgroup").write_text(
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/"
            f"cri-containerd-{n:064x}.scope\n"
        )
        holders.append(PodDevice("nvidia.com/mig-1g.10gb", mig, f"job-{n}", "team", "worker", 1))
    return holders


def timed(fn: Callable[[], object], rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        out.append(time.perf_counter() - started)
    return out


def p99(values: list[float]) -> float:
    return sorted(values)[min(len(values) - 1, round(0.99 * (len(values) - 1)))]


def row(name: str, values: list[float], baseline: list[float] | None) -> str:
    med = statistics.median(values)
    ratio = f"{med / statistics.median(baseline):6.2f}x" if baseline else "      -"
    return f"  {name:44} {med * 1e3:9.2f} {p99(values) * 1e3:9.2f} {ratio}"


def run_parts(rounds: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="nss-"))
    try:
        node = mig_node(root / "sim")
        empty = timed(node.snapshot, rounds)
        holders = start_processes(node, root / "sim", root / "proc")
        full = timed(node.snapshot, rounds)
        snapshot = node.snapshot()
        procs = sum(len(g.telemetry.processes) for g in snapshot.gpus if g.telemetry)
        index = PodIndex({uid(n): ("team", f"job-{n}") for n in range(PODS)})
        reader = CgroupReader(root / "proc")
        first = timed(lambda: attribute(snapshot, holders, CgroupReader(root / "proc"), index), 5)
        cached = timed(lambda: attribute(snapshot, holders, reader, index), rounds)
        off = Renderer(Sources(policy=PoolPolicy))
        on = Renderer(
            Sources(policy=PoolPolicy, cgroups=CgroupReader(root / "proc"), pod_index=lambda: index)
        )
        render_off = timed(lambda: off.render(snapshot), rounds)
        render_on = timed(lambda: on.render(snapshot), rounds)
        named = sum(1 for p in on.processes if p.workload is not None and p.workload.named)
        print(f"parts: dgx-h100, 56 MIG devices, {procs} processes ({named} attributed to pods)")
        print(f"  {'':44} {'median ms':>9} {'p99 ms':>9} {'ratio':>7}")
        print(row("snapshot, no processes (baseline)", empty, None))
        print(row("snapshot, 300 processes", full, empty))
        print(row("attribute 300 (cgroups read, first pass)", first, None))
        print(row("attribute 300 (cgroups cached)", cached, None))
        print(row("render, attribution off (baseline)", render_off, None))
        print(row("render, attribution on", render_on, render_off))
        node.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_agent(seconds: float, with_processes: bool, threads: bool) -> tuple[float, float]:
    """The whole agent's CPU % and RSS MiB, with or without the 300 processes."""

    def prepare(node: GpuNode, root: Path) -> None:
        start_processes(node, root / "sim", root / "proc")

    with running_agent(
        threads=threads, proc_root=True, prepare=prepare if with_processes else None
    ) as agent:
        pct, rss, _, per_thread = measure(agent.child, agent.port, seconds, 15.0, agent.names_file)
    if threads:
        print(f"  by thread, {'300 processes' if with_processes else 'no processes'}:")
        print_threads(per_thread)
    return pct, rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_window_arguments(parser, seconds=30.0)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--only", choices=("parts", "agent"))
    args = parser.parse_args()
    print("machine: 2 cores, 24 GiB (shared); simulated NVML")
    if args.only in (None, "parts"):
        run_parts(args.rounds)
    if args.only in (None, "agent"):
        base = run_agent(args.seconds, with_processes=False, threads=args.threads)
        full = run_agent(args.seconds, with_processes=True, threads=args.threads)
        print(f"whole agent, 1 s interval, {args.seconds:.0f} s window each")
        print(f"  {'':32} {'CPU % core':>10} {'RSS MiB':>8}")
        print(f"  {'no processes (baseline)':32} {base[0]:10.2f} {base[1]:8.1f}")
        print(f"  {'300 processes, attributed':32} {full[0]:10.2f} {full[1]:8.1f}")
        print(f"  {'ratio':32} {full[0] / base[0]:9.2f}x {full[1] / base[1]:7.2f}x")
        budget = "within" if full[0] < 2.0 and full[1] < 100 else "OVER"
        print(f"  budget (2 % of a core, 100 MB): {budget}")


if __name__ == "__main__":
    main()
