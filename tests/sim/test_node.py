"""Presets, topology, shared state across processes, read cost, the compat module and the CLI."""

from __future__ import annotations

import ctypes
import json
import logging
import os
import subprocess
import sys
import time

import pynvml
import pytest
from typer.testing import CliRunner

from nodeagent.cli.sim import app
from nodeagent.sim import presets
from nodeagent.sim.control import SimControl, SimError
from nodeagent.sim.nvml import SimNvml


@pytest.mark.parametrize(
    ("preset", "count", "name"),
    [
        pytest.param("dgx-a100", 8, "NVIDIA A100-SXM4-40GB", id="dgx-a100"),
        pytest.param("dgx-a100-80", 8, "NVIDIA A100-SXM4-80GB", id="dgx-a100-80"),
        pytest.param("dgx-h100", 8, "NVIDIA H100 80GB HBM3", id="dgx-h100"),
        pytest.param("hgx-h200", 8, "NVIDIA H200", id="hgx-h200"),
        pytest.param("pcie-l40s", 8, "NVIDIA L40S", id="pcie-l40s"),
        pytest.param("pcie-h100nvl", 4, "NVIDIA H100 NVL", id="pcie-h100nvl"),
        pytest.param("a30x4", 4, "NVIDIA A30", id="a30x4"),
        pytest.param("t4", 1, "Tesla T4", id="t4"),
    ],
)
def test_preset_inventory(make_sim, preset, count, name):
    sim = make_sim(preset)
    assert sim.nvmlDeviceGetCount() == count
    handles = [sim.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    assert {sim.nvmlDeviceGetName(h) for h in handles} == {name}
    uuids = [sim.nvmlDeviceGetUUID(h) for h in handles]
    buses = [sim.nvmlDeviceGetPciInfo(h).busId for h in handles]
    assert len(set(uuids)) == len(set(buses)) == count
    assert all(u.startswith("GPU-") and len(u) == 40 for u in uuids)
    for i, (uuid, bus) in enumerate(zip(uuids, buses, strict=True)):
        assert sim.nvmlDeviceGetIndex(sim.nvmlDeviceGetHandleByUUID(uuid)) == i
        assert sim.nvmlDeviceGetIndex(sim.nvmlDeviceGetHandleByPciBusId(bus)) == i
    assert presets.gpu_uuid(preset, 0) == uuids[0]  # stable across runs
    assert sim.nvmlSystemGetCudaDriverVersion() == 12080
    numa = [sim.nvmlDeviceGetNumaNodeId(h) for h in handles]
    assert numa == ([0] * 4 + [1] * 4 if count == 8 else [0] * count)


def _topo(sim: SimNvml, i: int, j: int) -> str:
    """The nvidia-smi topo -m cell for (i, j), built only from NVML calls."""
    a, b = sim.nvmlDeviceGetHandleByIndex(i), sim.nvmlDeviceGetHandleByIndex(j)
    links = 0
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            if not sim.nvmlDeviceGetNvLinkState(a, link):
                continue
        except pynvml.NVMLError_NotSupported:
            break
        remote_type = sim.nvmlDeviceGetNvLinkRemoteDeviceType(a, link)
        to_switch = remote_type == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
        remote_bus = sim.nvmlDeviceGetNvLinkRemotePciInfo(a, link).busId
        if to_switch or remote_bus == sim.nvmlDeviceGetPciInfo(b).busId:
            links += 1
    if links:
        return f"NV{links}"
    level = sim.nvmlDeviceGetTopologyCommonAncestor(a, b)
    return {10: "PIX", 40: "NODE", 50: "SYS"}[level]


@pytest.mark.parametrize(
    ("preset", "pairs"),
    [
        pytest.param("dgx-a100", {(0, 7): "NV12", (0, 1): "NV12"}, id="dgx-a100"),
        pytest.param("hgx-h200", {(3, 4): "NV18"}, id="hgx-h200"),
        pytest.param(
            "pcie-l40s",
            {(0, 1): "PIX", (0, 2): "NODE", (0, 4): "SYS", (6, 7): "PIX"},
            id="pcie-l40s",
        ),
        pytest.param(
            "pcie-h100nvl", {(0, 1): "NV12", (2, 3): "NV12", (0, 2): "NODE"}, id="pcie-h100nvl"
        ),
    ],
)
def test_topology(make_sim, preset, pairs):
    sim = make_sim(preset)
    for (i, j), cell in pairs.items():
        assert _topo(sim, i, j) == cell


def test_existing_state_wins_over_the_preset_argument(tmp_path, clock):
    first = SimNvml(tmp_path / "s", "t4", clock=clock)
    first.nvmlInit()
    second = SimNvml(tmp_path / "s", "dgx-a100", clock=clock)
    second.nvmlInit()
    assert second.nvmlDeviceGetCount() == 1


def test_no_state_and_no_preset_is_driver_not_loaded(tmp_path):
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        SimNvml(tmp_path / "empty").nvmlInit()


def test_calls_before_init_are_uninitialized(tmp_path):
    sim = SimNvml(tmp_path / "s", "t4")
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        sim.nvmlDeviceGetCount()


def test_change_by_another_process_is_seen(make_sim):
    sim = make_sim("dgx-a100")
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    assert sim.nvmlDeviceGetMigMode(handle) == [0, 0]
    script = (
        "import sys; from nodeagent.sim.control import SimControl;"
        "c = SimControl(sys.argv[1]); c.set_mig_mode(0, True); c.reset_gpu(0);"
        "print(c.add_process(1, used_memory_mib=512))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(sim.store.state_dir)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    pid = int(out.stdout)
    assert sim.nvmlDeviceGetMigMode(handle) == [1, 1]
    procs = sim.nvmlDeviceGetComputeRunningProcesses(sim.nvmlDeviceGetHandleByIndex(1))
    assert [p.pid for p in procs] == [pid]


def test_a_sampling_pass_is_cheap(make_sim, control_for):
    sim = make_sim("dgx-h100")
    control_for(sim).add_process(0)
    gpu, sm = pynvml.NVML_TEMPERATURE_GPU, pynvml.NVML_CLOCK_SM

    def one_pass() -> int:
        calls = 0
        for i in range(sim.nvmlDeviceGetCount()):
            h = sim.nvmlDeviceGetHandleByIndex(i)
            for _ in range(2):  # ~25 calls per GPU, like a sampler's pass
                sim.nvmlDeviceGetUtilizationRates(h)
                sim.nvmlDeviceGetMemoryInfo(h)
                sim.nvmlDeviceGetTemperature(h, gpu)
                sim.nvmlDeviceGetPowerUsage(h)
                sim.nvmlDeviceGetTotalEnergyConsumption(h)
                sim.nvmlDeviceGetClockInfo(h, sm)
                sim.nvmlDeviceGetCurrentClocksEventReasons(h)
                sim.nvmlDeviceGetTotalEccErrors(h, 1, 1)
                sim.nvmlDeviceGetRemappedRows(h)
                sim.nvmlDeviceGetComputeRunningProcesses(h)
                sim.nvmlDeviceGetMigMode(h)
                sim.nvmlDeviceGetNvLinkState(h, 0)
                calls += 12
        return calls

    one_pass()  # warm the cache
    start = time.perf_counter()
    calls = one_pass()
    elapsed = time.perf_counter() - start
    assert calls >= 190
    assert elapsed < 0.05, f"{calls} calls took {elapsed * 1000:.1f} ms"


def test_a_handle_is_read_the_same_in_every_form_and_a_wrong_one_is_invalid(make_sim):
    # pynvml passes typed pointers; the C library's callers and tools may pass a void pointer
    # or the bare address. Anything that is not an address is INVALID_ARGUMENT, as the driver.
    sim = make_sim("t4")
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    address = ctypes.cast(handle, ctypes.c_void_p).value
    assert address is not None
    uuid = sim.nvmlDeviceGetUUID(handle)
    assert sim.nvmlDeviceGetUUID(ctypes.c_void_p(address)) == uuid
    assert sim.nvmlDeviceGetUUID(address) == uuid
    for wrong in (
        "GPU-0",
        ctypes.c_uint(5),
        ctypes.c_void_p(None),
        ctypes.c_void_p(address ^ 1 << 62),
    ):
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            sim.nvmlDeviceGetUUID(wrong)


def test_this_process_s_change_is_seen_at_once(make_sim, control_for):
    # Reads trust a stat for a couple of milliseconds; a write through another store of this
    # process must not wait for that.
    sim = make_sim("dgx-a100")
    handle = sim.nvmlDeviceGetHandleByIndex(1)
    assert sim.nvmlDeviceGetComputeRunningProcesses(handle) == []
    for _ in range(3):
        pid = control_for(sim).add_process(1, used_memory_mib=512)
        assert pid in [p.pid for p in sim.nvmlDeviceGetComputeRunningProcesses(handle)]


def test_compat_module_stands_in_for_pynvml(tmp_path, monkeypatch):
    monkeypatch.setenv("NODEAGENT_SIM_STATE", str(tmp_path / "compat"))
    monkeypatch.setenv("NODEAGENT_SIMULATE", "t4")
    script = (
        "import sys; import nodeagent.sim.pynvml_compat as c; sys.modules['pynvml'] = c;"
        "import pynvml; pynvml.nvmlInit();"
        "h = pynvml.nvmlDeviceGetHandleByIndex(0);"
        "print(pynvml.nvmlDeviceGetName(h), pynvml.NVML_ERROR_IN_USE)"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], check=True, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.strip() == "Tesla T4 19"


def test_control_reset_and_unknown_preset(tmp_path, clock):
    control = SimControl(tmp_path / "c", clock=clock)
    with pytest.raises(SimError, match="unknown preset 'dgx-z'") as caught:
        control.reset("dgx-z")
    assert "dgx-a100" in caught.value.hint
    control.reset("a30x4")
    assert control.state()["preset"] == "a30x4"
    with pytest.raises(SimError, match=r"GPU index 4 is out of range") as caught:
        control.clear(4)
    assert caught.value.hint == "this node has GPUs 0..3"


def test_cli_round_trip(tmp_path):
    runner = CliRunner()
    env = {"NODEAGENT_SIM_STATE": str(tmp_path / "cli"), "NODEAGENT_SIMULATE": "dgx-a100"}
    listed = runner.invoke(app, ["presets", "--json"])
    assert listed.exit_code == 0
    assert [p["name"] for p in json.loads(listed.output)] == presets.preset_names()
    added = runner.invoke(app, ["process", "add", "--gpu", "2"], env=env)
    assert added.exit_code == 0
    pid = int(added.output)
    busy = runner.invoke(app, ["reset-gpu", "--gpu", "2"], env=env)
    assert busy.exit_code == 2
    assert "processes are running" in busy.output
    assert runner.invoke(app, ["process", "remove", str(pid)], env=env).exit_code == 0
    assert (
        runner.invoke(app, ["inject", "xid", "--gpu", "2", "--code", "79"], env=env).exit_code == 0
    )
    assert runner.invoke(app, ["clear", "--gpu", "2"], env=env).exit_code == 0


@pytest.mark.parametrize(
    ("args", "cause"),
    [
        pytest.param(["inject", "lost", "--gpu", "12"], "GPU index 12 is out of range", id="gpu"),
        pytest.param(["inject", "xid", "--gpu", "0"], "needs an XID code", id="xid-code"),
        pytest.param(["reset", "--simulate", "dgx-z"], "unknown preset 'dgx-z'", id="preset"),
        pytest.param(["process", "remove", "1"], "no simulated process 1", id="pid"),
        pytest.param(
            ["inject", "xid", "--gpu", "0", "--code", "1", "--mig", "MIG-x"],
            "no MIG device MIG-x",
            id="mig",
        ),
    ],
)
def test_cli_errors_are_two_lines_and_exit_2(tmp_path, args, cause):
    env = {"NODEAGENT_SIM_STATE": str(tmp_path / "cli"), "NODEAGENT_SIMULATE": "dgx-a100"}
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 2
    assert cause in lines[0]
    assert lines[1].startswith("hint: ")
    assert "Traceback" not in result.output


def test_another_preset_in_the_state_dir_wins_with_one_warning(tmp_path, clock, caplog):
    state_dir = tmp_path / "held"
    SimControl(state_dir, clock=clock).reset("dgx-h100")
    with caplog.at_level(logging.WARNING, logger="nodeagent.sim.state"):
        for _ in range(2):  # opened twice in one process: one warning
            sim = SimNvml(state_dir, "pcie-l40s", clock=clock)
            sim.nvmlInit()
            assert (
                sim.nvmlDeviceGetName(sim.nvmlDeviceGetHandleByIndex(0)) == "NVIDIA H100 80GB HBM3"
            )
            sim.nvmlShutdown()
        assert (
            SimControl(state_dir, preset="pcie-l40s", clock=clock).state()["preset"] == "dgx-h100"
        )
        SimControl(state_dir, preset="dgx-h100", clock=clock).state()  # the same preset: quiet
        SimControl(state_dir, clock=clock).state()  # no preset named: quiet
    [record] = caplog.records
    message = record.getMessage()
    assert "is a dgx-h100, not the pcie-l40s asked for" in message
    assert f"nodeagent sim reset --simulate pcie-l40s --state-dir {state_dir}" in message


def test_cli_warns_on_stderr_when_the_state_dir_holds_another_preset(tmp_path):
    state_dir = tmp_path / "held"
    SimControl(state_dir).reset("dgx-h100")
    script = "import sys; from nodeagent.cli.main import main; sys.argv[0] = 'nodeagent'; main()"
    out = subprocess.run(
        [sys.executable, "-c", script, "topo", "--simulate", "pcie-l40s"],
        env={**os.environ, "NODEAGENT_SIM_STATE": str(state_dir)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "NV18" in out.stdout  # the H100 node's NVSwitch links: the state dir won
    [line] = out.stderr.splitlines()
    assert "dgx-h100, not the pcie-l40s asked for" in line
    assert "nodeagent sim reset --simulate pcie-l40s --state-dir" in line
