"""Real third-party pynvml tools, unmodified, on a simulated node: gpustat and nvitop.

A simulated DGX H100 gets MIG on GPUs 0 and 1 (through `nodeagent mig apply`), two real host
processes (one on a MIG device, one on GPU 3), a thermal fault on GPU 3 and a failing power
reading on GPU 5. Then `gpustat --json`, nvitop's Python API and `nvitop -1` run through
`nodeagent sim exec`, and what they report must be what `nodeagent gpus --json`, `status --json`
and `mig show --json` report for the same node. The telemetry is frozen (NODEAGENT_SIM_TIME) so
that separate programs read the same values.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nodeagent.sim.control import SimControl

MIB = 1024 * 1024
BIN = Path(sys.executable).parent
LAYOUT = """\
version: v1
mig-configs:
  mixed:
    - devices: [0, 1]
      mig-enabled: true
      mig-devices: {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}
"""
THERMAL_GPU = 3  # runs a process and overheats
POWER_FAULT_GPU = 5  # its power reading fails with NVML TIMEOUT


@dataclass
class Node:
    """The simulated node and what every program reported about it."""

    env: dict[str, str]
    pids: dict[str, int]  # "mig" (on GPU 0's 3g.40gb), "gpu" (on the thermal GPU)
    gpus: list[dict[str, Any]]  # nodeagent gpus --json
    status: list[dict[str, Any]]  # nodeagent status --json
    mig: dict[int, list[dict[str, Any]]]  # nodeagent mig show --json, instances per GPU
    gpustat: list[dict[str, Any]]
    nvitop: list[dict[str, Any]]
    nvitop_screen: str


def _run(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [str(BIN / "nodeagent"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"nodeagent {' '.join(args)}: {done.stderr}"
    return done.stdout


def _exec(env: dict[str, str], *command: str) -> str:
    return _run(env, "sim", "exec", "--", *command)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    base = tmp_path_factory.mktemp("thirdparty")
    state = base / "node"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
    env |= {
        "NODEAGENT_SIM_STATE": str(state),
        "NODEAGENT_SIMULATE": "dgx-h100",
        "NODEAGENT_SIM_TIME": str(float(int(time.time()))),
    }
    layout = base / "layout.yaml"
    layout.write_text(LAYOUT)
    _run(env, "mig", "apply", "-f", str(layout), "-c", "mixed", "--allow-reset")
    control = SimControl(state)
    big = next(
        ci["uuid"]
        for gi in control.state()["gpus"][0]["instances"]
        if gi["profile_id"] == 9
        for ci in gi["cis"]
    )
    sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(2)]
    try:
        pids = {
            "mig": control.add_process(0, mig_uuid=big, used_memory_mib=3000, pid=sleepers[0].pid),
            "gpu": control.add_process(
                THERMAL_GPU, used_memory_mib=5000, load=0.7, pid=sleepers[1].pid
            ),
        }
        control.inject("thermal", THERMAL_GPU)
        control.inject("nvml-error", POWER_FAULT_GPU, function="nvmlDeviceGetPowerUsage")
        mig_show = json.loads(_run(env, "mig", "show", "--json"))
        report = Path(__file__).with_name("nvitop_report.py")
        yield Node(
            env=env,
            pids=pids,
            gpus=json.loads(_run(env, "gpus", "--json")),
            status=json.loads(_run(env, "status", "--json"))["gpus"],
            mig={g["index"]: g["instances"] for g in mig_show["gpus"]},
            gpustat=json.loads(_exec(env, "gpustat", "--json"))["gpus"],
            nvitop=json.loads(_exec(env, "python", str(report))),
            nvitop_screen=_exec(env, "nvitop", "-1"),
        )
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()


GPUS = [pytest.param(i, id=f"gpu{i}") for i in range(8)]


def _percent(ratio: float | None) -> int | None:
    return None if ratio is None else round(ratio * 100)


@pytest.mark.parametrize("index", GPUS)
def test_gpustat_reports_what_nodeagent_reports(node: Node, index: int) -> None:
    theirs, info, status = node.gpustat[index], node.gpus[index], node.status[index]
    assert (theirs["index"], theirs["uuid"], theirs["name"]) == (index, info["uuid"], info["name"])
    assert theirs["memory.total"] == info["memory_total_bytes"] // MIB
    # Both read memory info v2: "used" leaves out what the driver and firmware reserve.
    assert theirs["memory.used"] == status["memory_used_bytes"] // MIB
    assert theirs["temperature.gpu"] == status["temperature_celsius"]
    assert theirs["utilization.gpu"] == _percent(status["utilization_ratio"])
    watts = status["power_watts"]
    assert theirs["power.draw"] == (None if watts is None else int(watts))
    assert len(theirs["processes"]) == status["processes"]


def test_gpustat_sees_the_processes_the_fault_and_mig(node: Node) -> None:
    by_index = {g["index"]: g for g in node.gpustat}
    assert [p["pid"] for p in by_index[0]["processes"]] == [node.pids["mig"]]
    assert [p["pid"] for p in by_index[THERMAL_GPU]["processes"]] == [node.pids["gpu"]]
    assert by_index[THERMAL_GPU]["processes"][0]["gpu_memory_usage"] == 5000
    assert by_index[THERMAL_GPU]["temperature.gpu"] > 85  # past the slowdown threshold
    assert by_index[POWER_FAULT_GPU]["power.draw"] is None
    assert [g["utilization.gpu"] is None for g in node.gpustat] == [i < 2 for i in range(8)]


@pytest.mark.parametrize("index", GPUS)
def test_nvitop_reports_what_nodeagent_reports(node: Node, index: int) -> None:
    theirs, info, status = node.nvitop[index], node.gpus[index], node.status[index]
    assert (theirs["uuid"], theirs["name"]) == (info["uuid"], info["name"])
    assert theirs["memory_total"] == info["memory_total_bytes"]
    assert theirs["memory_used"] == status["memory_used_bytes"]
    assert theirs["utilization"] == _percent(status["utilization_ratio"])
    assert theirs["temperature"] == status["temperature_celsius"]
    watts = status["power_watts"]
    assert theirs["power_mw"] == (None if watts is None else round(watts * 1000))
    assert len(theirs["processes"]) == status["processes"]
    instances = node.mig.get(index, [])
    got = sorted((m["uuid"], m["name"].rsplit(" ", 1)[-1], m["gi"]) for m in theirs["mig"])
    assert got == sorted((g["uuid"], g["profile"], g["instance_id"]) for g in instances)


def test_nvitop_puts_the_mig_process_on_the_busy_instance(node: Node) -> None:
    busy = [g for g in node.mig[0] if g["busy"]]
    assert [g["profile"] for g in busy] == ["3g.40gb"]
    procs = node.nvitop[0]["processes"]
    assert [(p["pid"], p["gi"], p["gpu_memory"]) for p in procs] == [
        (node.pids["mig"], busy[0]["instance_id"], 3000 * MIB)
    ]


def test_nvitop_one_shot_shows_the_node(node: Node) -> None:
    screen = node.nvitop_screen
    assert "Traceback" not in screen
    assert "ERROR" not in screen
    assert "Driver Version: 570.124.06" in screen
    for index in (0, 1):
        for gi in node.mig[index]:
            assert f"{index}:" in screen
            assert f"{gi['profile']} @ GI/CI: {gi['instance_id']}/0" in screen
    for pid in node.pids.values():
        assert f" {pid} C " in screen
    hot = node.status[THERMAL_GPU]["temperature_celsius"]
    assert f"{round(hot)}C" in screen
