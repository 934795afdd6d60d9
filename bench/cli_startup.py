"""CLI start-up: how long read-only commands take, against a bare interpreter in the same run.

    python bench/cli_startup.py [--runs 21] [--preset dgx-h100]

Each command runs as an operator runs it (the installed ``nodeagent`` script, a fresh process)
against a simulated node; the runs are interleaved, command after command, so a noisy
neighbour on a shared machine hits every row alike. Baselines in the same run: ``python -c
pass`` (the interpreter and site-packages) and ``python -c 'import typer'`` (the CLI framework
every command needs). Target: median under 0.3 s for the read-only commands.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 0.3
READ_ONLY = [["--version"], ["gpus"], ["mig", "show"], ["health"], ["status"]]


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--preset", default="dgx-h100")
    args = ap.parse_args()
    script = Path(sys.executable).parent / "nodeagent"
    entry = [str(script)] if script.exists() else [sys.executable, "-m", "nodeagent.cli.main"]
    state = Path(tempfile.mkdtemp(prefix="cli-startup-"))
    # An installed nodeagent runs from bytecode (pip compiles a wheel's modules at install;
    # an editable install caches them at first import): a shell that forbids writing bytecode
    # would time compiling every module from source instead.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("NODEAGENT_") and k != "PYTHONDONTWRITEBYTECODE"
    }
    env.update(NODEAGENT_SIMULATE=args.preset, NODEAGENT_SIM_STATE=str(state / "sim"))
    env["NODEAGENT_STATE_DIR"] = str(state / "agent")
    subprocess.run([*entry, "gpus"], env=env, stdout=subprocess.DEVNULL, check=True)  # seed
    rows: dict[str, list[str]] = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "python -c 'import typer'": [sys.executable, "-c", "import typer"],
    }
    for command in READ_ONLY:
        rows["nodeagent " + " ".join(command)] = [*entry, *command]
    samples: dict[str, list[float]] = {name: [] for name in rows}
    for argv in rows.values():
        timed(argv, env)  # warm the page cache and the bytecode caches
    for _ in range(args.runs):
        for name, argv in rows.items():
            samples[name].append(timed(argv, env))
    shutil.rmtree(state, ignore_errors=True)
    base = statistics.median(samples["python -c pass"])
    cpus = os.cpu_count()
    print(f"{platform.node()}: {cpus} CPUs, Python {platform.python_version()}, {args.runs} runs")
    print(f"{'command':<28} {'median s':>9} {'p99 s':>7} {'x pass':>7}  target")
    worst = 0.0
    for name, values in samples.items():
        median = statistics.median(values)
        verdict = ""
        if name.startswith("nodeagent"):
            verdict = "ok" if median < TARGET_S else "SLOW"
            worst = max(worst, median)
        p99 = pct(values, 0.99)
        print(f"{name:<28} {median:>9.3f} {p99:>7.3f} {median / base:>7.1f}  {verdict}")
    print(f"slowest read-only command: {worst:.3f} s (target {TARGET_S} s)")


if __name__ == "__main__":
    main()
