"""Per-process usage in the snapshot: names, memory, SM share, MPS clients, MIG."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from nodeagent.gpu.node import GpuNode
from nodeagent.gpu.types import Placement
from nodeagent.sim.control import SimControl

MakeNode = Callable[..., GpuNode]
MIB = 1024 * 1024


@pytest.fixture
def control(sim_state_dir: Path) -> SimControl:
    return SimControl(sim_state_dir)


def test_time_sliced_processes_carry_their_own_numbers(
    make_node: MakeNode, control: SimControl
) -> None:
    node = make_node("dgx-h100")
    a = control.add_process(3, used_memory_mib=2000, load=0.6, name="trainer")
    b = control.add_process(3, used_memory_mib=6000, load=0.9, name="vllm", mps=True)
    snapshot = node.snapshot()
    telemetry = snapshot.gpus[3].telemetry
    assert telemetry is not None
    procs = {p.pid: p for p in telemetry.processes}
    assert procs[a].name == "trainer"
    assert procs[b].name == "vllm"
    assert (procs[a].used_memory_bytes, procs[b].used_memory_bytes) == (2000 * MIB, 6000 * MIB)
    assert (procs[a].mps_client, procs[b].mps_client) == (False, True)
    sm_a, sm_b = procs[a].sm_utilization_ratio, procs[b].sm_utilization_ratio
    assert sm_a is not None
    assert sm_b is not None
    # 1.5 of the GPU asked for: 0.4 and 0.6 of its time, swinging 0.8..1.0 with the wave.
    assert 0.31 <= sm_a <= 0.41
    assert 0.47 <= sm_b <= 0.61
    assert sm_a < sm_b
    assert procs[a].memory_utilization_ratio is not None
    assert telemetry.utilization_gpu_ratio is not None
    assert abs(sm_a + sm_b - telemetry.utilization_gpu_ratio) <= 0.02


def test_mig_processes_have_memory_and_no_utilization(
    make_node: MakeNode, control: SimControl
) -> None:
    node = make_node("dgx-h100")
    node.set_mig_mode(1, True)
    node.reset_gpu(1)
    instance = node.create_gpu_instance(1, "1g.10gb", Placement(0, 1))
    mig_uuid = instance.compute_instances[0].uuid
    pid = control.add_process(1, mig_uuid=mig_uuid, used_memory_mib=900, load=0.3)
    telemetry = node.snapshot().gpus[1].telemetry
    assert telemetry is not None
    (proc,) = telemetry.processes
    assert (proc.pid, proc.used_memory_bytes, proc.gpu_instance_id) == (
        pid,
        900 * MIB,
        instance.instance_id,
    )
    assert proc.name == "python3"
    assert proc.sm_utilization_ratio is None  # NVML keeps no per-process samples under MIG


def test_names_are_forgotten_with_their_process(make_node: MakeNode, control: SimControl) -> None:
    node = make_node("dgx-h100")
    pid = control.add_process(0, name="first")
    node.snapshot()
    control.remove_process(pid)
    node.snapshot()
    # The simulator hands out fresh PIDs, so reattach under a given PID to test reuse.
    control.add_process(0, name="second", pid=pid)
    telemetry = node.snapshot().gpus[0].telemetry
    assert telemetry is not None
    assert [p.name for p in telemetry.processes] == ["second"]
