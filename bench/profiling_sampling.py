"""Cost of GPM profiling: dgx-h100 with 56 MIG instances, profiling on against off.

    .venv/bin/python bench/profiling_sampling.py [--seconds 30] [--rounds 40]
                                                 [--only parts|agent] [--threads] [--spy]

Node: dgx-h100 split into 56 ``1g.10gb`` instances (``exporter_node.py``), one compute process
on each (load 0.1), so every instance has figures that move.

A GPM pass takes one sample per GPU and per GPU instance (64 here) and computes the metrics
between it and the previous GPM pass's sample (64 ``nvmlGpmMetricsGet`` calls): the two samples
of each interval, one of them reused from the pass before. The agent makes a GPM pass every
``sampler.profiling_interval_s`` (5 s); the sampler passes between carry the figures.

``parts`` (in this process, medians and p99 over ``--rounds``): the snapshot with profiling off
(the baseline), on with a GPM sample on the pass, and on between GPM passes (figures carried),
and the render of each snapshot, in the same run.

``agent``: the whole agent (``nodeagent run``, every component on, as ``exporter_resources.py``:
sampler at 1 s, a scrape every 15 s), profiling off (the baseline: the agent started with its
GPM reader switched off) then on. CPU is % of one core over the window after a warm-up, RSS the
maximum.

``--spy`` (with ``agent``): after each measured window, py-spy (not a project dependency: on
PATH or beside this interpreter) samples the agent for another window, and the share of its
samples inside the simulated NVML (``nodeagent/sim/`` frames: the Python standing in for the
driver's C library) is printed per thread; the rest is the agent's own cost. Sampling slows
the agent, so it never overlaps the CPU window.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, __file__.rsplit("/", 1)[0])

from exporter_node import mig_node
from exporter_resources import (
    THREAD_NAMES,
    add_window_arguments,
    measure,
    print_threads,
    running_agent,
)

from nodeagent.config.pool_policy import PoolPolicy
from nodeagent.gpu.node import GpuNode
from nodeagent.sim.control import SimControl
from nodeagent_exporters.render import Renderer, Sources

# The agent's CLI entry point as the console script calls it; with profiling off, the GPM
# reader of every GpuNode the agent opens starts switched off (no GPM call is made at all).
SWITCH = """
import sys
if sys.argv[1] == "off":
    from nodeagent.gpu import profiling
    _init = profiling.ProfilingReader.__init__
    def _off(self, *args, **kwargs):
        _init(self, *args, **kwargs)
        self.enabled = False
    profiling.ProfilingReader.__init__ = _off
del sys.argv[1]
"""
PLAIN = """
from nodeagent.cli.main import main
sys.argv[0] = "nodeagent"
sys.exit(main())
"""


def load_instances(node: GpuNode, state_dir: Path) -> int:
    """One process (load 0.1) on every MIG device; returns how many."""
    control = SimControl(state_dir)
    count = 0
    for g in range(node.count()):
        for gi in node.mig_instances(g):
            if gi.uuid:
                control.add_process(g, mig_uuid=gi.uuid, used_memory_mib=1024, load=0.1)
                count += 1
    return count


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
    return f"  {name:40} {med * 1e3:9.2f} {p99(values) * 1e3:9.2f} {ratio}"


def run_parts(rounds: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="nps-"))
    try:
        node = mig_node(root / "sim")
        busy = load_instances(node, root / "sim")
        node.profiling_enabled = False
        off = timed(node.snapshot, rounds)
        snap_off = node.snapshot()
        node.profiling_enabled = True
        node.profiling_interval_s = 0.0  # a GPM sample on every pass
        node.snapshot()  # the first sample of each device: no interval yet
        on = timed(node.snapshot, rounds)
        snap_on = node.snapshot()
        node.profiling_interval_s = 3600.0  # between GPM passes: the figures are carried
        node.snapshot()
        carried = timed(node.snapshot, rounds)
        # The agent's default: a 1 s sampler, GPM every 5 s (sampler.profiling_interval_s).
        per_pass = (statistics.median(on) + 4 * statistics.median(carried)) / 5
        added = per_pass - statistics.median(off)
        figures = sum(1 for g in snap_on.gpus for gi in g.mig_instances if gi.profiling)
        render_off = Renderer(Sources(policy=PoolPolicy))
        render_on = Renderer(Sources(policy=PoolPolicy))
        r_off = timed(lambda: render_off.render(snap_off), rounds)
        r_on = timed(lambda: render_on.render(snap_on), rounds)
        body = render_on.render(snap_on).body.count(b"\nnodeagent_") + 1
        prof = render_on.render(snap_on).body.count(b"\nnodeagent_mig_prof_")
        print(f"parts: dgx-h100, 56 MIG devices ({busy} busy), {figures} with figures")
        print(f"  {'':40} {'median ms':>9} {'p99 ms':>9} {'ratio':>7}")
        print(row("snapshot, profiling off (baseline)", off, None))
        print(row("snapshot, profiling on, GPM sampled", on, off))
        print(row("snapshot, profiling on, figures carried", carried, off))
        print(f"  at a 1 s sampler and GPM every 5 s: +{added * 1e3:.2f} ms a pass, "
              f"{added * 100:.2f} % of a core")  # fmt: skip
        print(row("render, profiling off (baseline)", r_off, None))
        print(row("render, profiling on", r_on, r_off))
        print(f"  series: {body} in all, {prof} nodeagent_mig_prof_*")
        node.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


SIM_FRAMES = "nodeagent/sim/"


def py_spy() -> str:
    """The py-spy program, or exit 2 saying how to get it."""
    found = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if found is None:
        raise SystemExit("--spy needs py-spy: pip install py-spy (beside this interpreter)")
    return found


def sim_share(pid: int, seconds: float, spy: str) -> None:
    """Sample process ``pid`` with py-spy; print each thread's samples and the simulator's part."""
    with tempfile.NamedTemporaryFile(suffix=".txt") as out:
        subprocess.run(
            [spy, "record", "--pid", str(pid), "--duration", str(round(seconds)),
             "--rate", "200", "--format", "raw", "--threads", "--nonblocking",
             "--output", out.name],
            check=True, capture_output=True, timeout=seconds + 60,
        )  # fmt: skip
        lines = Path(out.name).read_text().splitlines()
    total: collections.Counter[str] = collections.Counter()
    sim: collections.Counter[str] = collections.Counter()
    for line in lines:
        stack, _, count = line.rpartition(" ")
        thread = stack.split(";", 1)[0].split(": ", 1)[-1]  # "thread (0x..): NAME" -> NAME
        total[thread] += int(count)
        if SIM_FRAMES in stack:
            sim[thread] += int(count)
    every, in_sim = sum(total.values()), sum(sim.values())
    if not every:
        print("  py-spy took no sample")
        return
    print(f"  py-spy, {every} samples: {100 * in_sim / every:.0f} % in the simulated NVML, "
          f"{100 * (every - in_sim) / every:.0f} % the agent's own")  # fmt: skip
    for thread, samples in total.most_common(6):
        print(f"    {thread:26} {100 * samples / every:5.1f} % of samples, "
              f"{100 * sim[thread] / samples:3.0f} % of them simulator")  # fmt: skip


def run_agent(
    seconds: float, profiling: bool, threads: bool, spy: str | None = None
) -> tuple[float, float]:
    """The whole agent's CPU % and RSS MiB with profiling on or off."""

    def prepare(node: GpuNode, root: Path) -> None:
        load_instances(node, root / "sim")

    # With --threads, the thread-name dump of exporter_resources runs the CLI after the switch.
    script = SWITCH + (THREAD_NAMES if threads else PLAIN)
    launcher = [sys.executable, "-c", script, "on" if profiling else "off"]
    with running_agent(threads=threads, prepare=prepare, launcher=launcher) as agent:
        pct, rss, _, per_thread = measure(agent.child, agent.port, seconds, 15.0, agent.names_file)
        if spy is not None:
            print(f"profiling {'on' if profiling else 'off'}:")
            sim_share(agent.child.pid, seconds, spy)
    if threads:
        print(f"  by thread, profiling {'on' if profiling else 'off'}:")
        print_threads(per_thread)
    return pct, rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_window_arguments(parser, seconds=30.0)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--only", choices=("parts", "agent"))
    parser.add_argument(
        "--spy", action="store_true", help="also the simulator's share of the agent (py-spy)"
    )
    args = parser.parse_args()
    spy = py_spy() if args.spy else None
    print("machine: 2 cores (shared); simulated NVML")
    if args.only in (None, "parts"):
        run_parts(args.rounds)
    if args.only in (None, "agent"):
        base = run_agent(args.seconds, profiling=False, threads=args.threads, spy=spy)
        full = run_agent(args.seconds, profiling=True, threads=args.threads, spy=spy)
        print(f"whole agent, 1 s interval, {args.seconds:.0f} s window each")
        print(f"  {'':32} {'CPU % core':>10} {'RSS MiB':>8}")
        print(f"  {'profiling off (baseline)':32} {base[0]:10.2f} {base[1]:8.1f}")
        print(f"  {'profiling on':32} {full[0]:10.2f} {full[1]:8.1f}")
        print(f"  {'added':32} {full[0] - base[0]:10.2f} {full[1] - base[1]:8.1f}")
        budget = "within" if full[0] < 2.0 and full[1] < 100 else "OVER"
        print(f"  budget (2 % of a core, 100 MB): {budget}")


if __name__ == "__main__":
    main()
