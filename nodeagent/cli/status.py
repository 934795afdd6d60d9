"""``nodeagent status``: a live view of the node, one line per GPU, refreshed in place.

It samples the GPUs itself (utilization, memory, temperature, power, MIG layout) and adds the
health a running agent reports; ``--watch`` redraws every few seconds like ``watch``/``top``.
Health from an agent that no longer runs (its state-directory lock is free) is marked stale.
"""

from __future__ import annotations

import sys
import time
from typing import Annotated, Any

import typer

from nodeagent.cli.common import (
    AgentStateDirOption,
    ConfigOption,
    JsonOption,
    SimulateOption,
    StateDirOption,
    agent_state_dir,
    emit_json,
    fail,
    finite,
    format_table,
    gib,
    open_node_or_exit,
)
from nodeagent.gpu.node import GpuNode
from nodeagent.gpu.types import GpuState, NodeSnapshot
from nodeagent.health.statefile import read_status
from nodeagent.runtime.lock import AGENT_LOCK_FILE, is_held

CLEAR = "\x1b[H\x1b[2J"  # cursor home + clear screen (ANSI; every terminal nodeagent targets)


def _health_by_uuid(status: dict[str, Any] | None) -> dict[str, str]:
    if status is None:
        return {}
    return {d["uuid"]: d["state"] for d in status.get("devices", []) if d.get("parent") is None}


def _mig_layout_cell(gpu: GpuState) -> str:
    if not gpu.info.mig_enabled:
        return "-"
    profiles: dict[str, int] = {}
    for gi in gpu.mig_instances:
        profiles[gi.profile] = profiles.get(gi.profile, 0) + 1
    busy = sum(1 for gi in gpu.mig_instances if gi.busy)
    layout = " ".join(f"{n}x{p}" for p, n in sorted(profiles.items())) or "no instances"
    return f"{layout} ({busy} busy)" if busy else layout


def gpu_row(gpu: GpuState, health: dict[str, str], stale: bool = False) -> dict[str, Any]:
    """One GPU's line of the view, as data (also the ``--json`` shape)."""
    t = gpu.telemetry
    return {
        "gpu": gpu.info.index,
        "name": gpu.info.name,
        "lost": gpu.lost,
        "utilization_ratio": None if t is None else t.utilization_gpu_ratio,
        "memory_used_bytes": None if t is None else t.memory_used_bytes,
        "memory_total_bytes": gpu.info.memory_total_bytes,
        "temperature_celsius": None if t is None else t.temperature_celsius,
        "power_watts": None if t is None else t.power_watts,
        "processes": None if t is None else len(t.processes),
        "mig": _mig_layout_cell(gpu),
        "health": "lost" if gpu.lost else health.get(gpu.info.uuid, "unknown"),
        # The agent that wrote the health stopped: the state shown is its last word, not now.
        "health_stale": stale and not gpu.lost and gpu.info.uuid in health,
    }


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def render(snapshot: NodeSnapshot, status: dict[str, Any] | None, running: bool = True) -> str:
    """The view as text; ``running``: whether the agent that wrote ``status`` still runs."""
    rows = [gpu_row(g, _health_by_uuid(status), not running) for g in snapshot.gpus]
    header = (
        f"driver {snapshot.driver_version}  CUDA {snapshot.cuda_driver_version}  "
        f"{len(snapshot.gpus)} GPUs  sampled {time.strftime('%H:%M:%S')}"
    )
    if status is not None:
        stability = status.get("stability", {})
        header += f"  node {status.get('health')}, {stability.get('level')}"
        header += f" (score {stability.get('score', 0):.1f})"
        if not running:
            when = time.strftime("%H:%M:%S", time.localtime(float(status.get("timestamp_s", 0))))
            header += f"  (agent not running: health is stale, last written {when})"
    else:
        header += "  (no agent running: health unknown)"
    lines = [header, ""]
    table = [
        [
            str(r["gpu"]),
            "LOST" if r["lost"] else r["name"],
            _fmt(
                None if r["utilization_ratio"] is None else r["utilization_ratio"] * 100, "{:.0f}%"
            ),
            "-"
            if r["memory_used_bytes"] is None
            else f"{gib(r['memory_used_bytes'])}/{gib(r['memory_total_bytes'], 0)} GiB",
            _fmt(r["temperature_celsius"], "{:.0f}C"),
            _fmt(r["power_watts"], "{:.0f}W"),
            _fmt(r["processes"], "{}"),
            r["health"] + (" (stale)" if r["health_stale"] else ""),
            r["mig"],
        ]
        for r in rows
    ]
    headers = ["GPU", "NAME", "UTIL", "MEMORY", "TEMP", "POWER", "PROCS", "HEALTH", "MIG"]
    return "\n".join(lines) + "\n" + format_table(headers, table)


def status(
    watch: Annotated[
        float | None,
        typer.Option(
            "--watch",
            "-w",
            min=0.1,
            callback=finite,
            help="Redraw every this many seconds until Ctrl-C.",
        ),
    ] = None,
    as_json: JsonOption = False,
    simulate: SimulateOption = None,
    state_dir: StateDirOption = None,
    agent_state: AgentStateDirOption = None,
    config: ConfigOption = None,
) -> None:
    """A live view of the node: per GPU utilization, memory, temperature, power, health, MIG."""
    if watch is not None and watch < 0.2:
        fail(f"--watch {watch} is too fast", "use an interval of 0.2 seconds or more")
    state = agent_state_dir(agent_state, simulate, state_dir, config)
    node: GpuNode = open_node_or_exit(simulate, state_dir)
    warned = False
    try:
        while True:
            snapshot = node.snapshot()
            try:
                agent_status = read_status(state)
            except ValueError:
                agent_status = None  # being rewritten, or damaged: show health as unknown
            except OSError as exc:  # a directory in its place, no permission: say so once
                agent_status = None
                if not warned:
                    sys.stderr.write(f"warning: {exc}; GPU health shown as unknown\n")
                    warned = True
            running = is_held(state / AGENT_LOCK_FILE)
            if as_json:
                health = _health_by_uuid(agent_status)
                emit_json(
                    {
                        "agent": {"running": running},
                        "gpus": [gpu_row(g, health, not running) for g in snapshot.gpus],
                    }
                )
            else:
                text = render(snapshot, agent_status, running)
                sys.stdout.write((CLEAR if watch is not None else "") + text)
                sys.stdout.flush()
            if watch is None:
                return
            time.sleep(watch)
    except KeyboardInterrupt:
        return
    finally:
        node.close()
