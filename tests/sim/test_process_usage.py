"""Per-process usage in the simulated NVML: memory, SM share, names, MPS clients."""

from __future__ import annotations

import pynvml
import pytest

from nodeagent.sim.control import SimError
from tests.sim.conftest import two_slice_mig_device

MIB = 1024 * 1024


def _samples(sim, index: int, last_seen: int = 0) -> dict[int, tuple[int, int]]:
    handle = sim.nvmlDeviceGetHandleByIndex(index)
    return {
        s.pid: (s.smUtil, s.memUtil) for s in sim.nvmlDeviceGetProcessUtilization(handle, last_seen)
    }


@pytest.mark.parametrize(
    ("shares", "expected"),
    [
        pytest.param([0.3], [0.3], id="one-process"),
        pytest.param([0.2, 0.5], [0.2, 0.5], id="room-for-both"),
        # Asking for 1.5 of the GPU: time-slicing gives each its demand scaled by 1/1.5.
        pytest.param([0.6, 0.9], [0.4, 0.6], id="oversubscribed"),
        pytest.param([0.5, 0.5, 0.5, 0.5], [0.25, 0.25, 0.25, 0.25], id="four-equal"),
    ],
)
def test_process_sm_share_divides_the_gpu_time(make_sim, control_for, shares, expected):
    sim = make_sim("dgx-h100")
    control = control_for(sim)
    pids = [control.add_process(2, load=share) for share in shares]
    samples = _samples(sim, 2)
    assert sorted(samples) == sorted(pids)
    total = sum(sm for sm, _ in samples.values())
    gpu_util = sim.nvmlDeviceGetUtilizationRates(sim.nvmlDeviceGetHandleByIndex(2)).gpu
    # The per-process samples add up to the GPU-wide reading (each rounded on its own).
    assert abs(total - gpu_util) <= len(pids)
    for pid, want in zip(pids, expected, strict=True):
        sm, mem = samples[pid]
        # The readings swing 0.8..1.0 of the share with the GPU's slow wave.
        assert 0.8 * want * 100 - 1 <= sm <= want * 100 + 1
        assert mem < sm


def test_process_memory_is_what_it_says(make_sim, control_for):
    sim = make_sim("dgx-h100")
    control = control_for(sim)
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    before = sim.nvmlDeviceGetMemoryInfo(handle).used
    a = control.add_process(0, used_memory_mib=3000)
    b = control.add_process(0, used_memory_mib=5000)
    procs = {p.pid: p.usedGpuMemory for p in sim.nvmlDeviceGetComputeRunningProcesses(handle)}
    assert procs == {a: 3000 * MIB, b: 5000 * MIB}
    assert sim.nvmlDeviceGetMemoryInfo(handle).used - before == 8000 * MIB


def test_samples_newer_than_last_seen_only(make_sim, control_for, clock):
    sim = make_sim("dgx-h100")
    control_for(sim).add_process(1, load=0.5)
    handle = sim.nvmlDeviceGetHandleByIndex(1)
    (sample,) = sim.nvmlDeviceGetProcessUtilization(handle, 0)
    with pytest.raises(pynvml.NVMLError) as caught:
        sim.nvmlDeviceGetProcessUtilization(handle, sample.timeStamp)
    assert caught.value.value == pynvml.NVML_ERROR_NOT_FOUND
    clock.advance(1.0)
    (later,) = sim.nvmlDeviceGetProcessUtilization(handle, sample.timeStamp)
    assert later.timeStamp > sample.timeStamp
    (info,) = sim.nvmlDeviceGetProcessesUtilizationInfo(handle, 0)
    assert (info.pid, info.smUtil) == (later.pid, later.smUtil)


def test_idle_gpu_has_no_samples(make_sim, control_for):
    sim = make_sim("dgx-h100")
    control_for(sim).add_process(4, load=0.0)
    with pytest.raises(pynvml.NVMLError) as caught:
        sim.nvmlDeviceGetProcessUtilization(sim.nvmlDeviceGetHandleByIndex(4), 0)
    assert caught.value.value == pynvml.NVML_ERROR_NOT_FOUND


def test_mig_has_no_per_process_utilization_but_keeps_memory(make_sim, control_for):
    sim = make_sim("dgx-a100")
    handle, _, mig = two_slice_mig_device(sim)
    pid = control_for(sim).add_process(
        0, mig_uuid=sim.nvmlDeviceGetUUID(mig), used_memory_mib=700, load=0.2
    )
    for device in (handle, mig):
        with pytest.raises(pynvml.NVMLError) as caught:
            sim.nvmlDeviceGetProcessUtilization(device, 0)
        assert caught.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED
    (proc,) = sim.nvmlDeviceGetComputeRunningProcesses(mig)
    assert (proc.pid, proc.usedGpuMemory) == (pid, 700 * MIB)
    assert sim.nvmlDeviceGetMemoryInfo(mig).used >= 700 * MIB


def test_names_and_mps_clients(make_sim, control_for):
    sim = make_sim("dgx-h100")
    control = control_for(sim)
    server = control.add_process(0, name="nvidia-cuda-mps-server", used_memory_mib=30)
    client = control.add_process(0, name="vllm", mps=True)
    plain = control.add_process(1)
    assert sim.nvmlSystemGetProcessName(server) == b"nvidia-cuda-mps-server"
    assert sim.nvmlSystemGetProcessName(client) == b"vllm"
    assert sim.nvmlSystemGetProcessName(plain) == b"python3"
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    assert [p.pid for p in sim.nvmlDeviceGetMPSComputeRunningProcesses(handle)] == [client]
    assert {p.pid for p in sim.nvmlDeviceGetComputeRunningProcesses(handle)} == {server, client}
    with pytest.raises(pynvml.NVMLError) as caught:
        sim.nvmlSystemGetProcessName(99999)
    assert caught.value.value == pynvml.NVML_ERROR_NOT_FOUND


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"load": 1.5}, "outside 0..1", id="share"),
        pytest.param({"name": ""}, "not a command name", id="empty-name"),
        pytest.param({"name": "x" * 2000}, "not a command name", id="long-name"),
    ],
)
def test_bad_process_arguments(make_sim, control_for, kwargs, message):
    sim = make_sim("dgx-h100")
    with pytest.raises(SimError, match=message):
        control_for(sim).add_process(0, **kwargs)
