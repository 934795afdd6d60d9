"""MPS daemons per GPU, through a stand-in nvidia-cuda-mps-control speaking its protocol."""

from __future__ import annotations

import os
import signal
import time

from nodeagent.testing.mps_control import daemon_pid

MPS = {"mode": "mps", "replicas": 4}


def _mps_config(binary, sharing):
    return {
        "pools": {"default": {"gpu_sharing": {"1": sharing}}},
        "device_plugin": {"mps": {"control_binary": str(binary), "check_interval_s": 0.1}},
    }


def test_daemon_gets_limits_and_allocate_mounts_its_pipe(run_plugin, mps_binary) -> None:
    sharing = {**MPS, "mps_pinned_memory_limit_mib": 6000}
    plugin = run_plugin("a30x4", config=_mps_config(mps_binary, sharing))
    u = plugin.uuid(1)
    plugin.kubelet.wait_devices("nvidia.com/gpu", lambda d: d.get(f"{u}::0", ("",))[0] == "Healthy")
    daemon = plugin.manager.mps.daemon(u)
    assert daemon is not None
    log = (daemon.log_dir / "control.log").read_text().splitlines()
    assert "set_default_active_thread_percentage 25" in log  # 100 / 4 replicas
    assert "set_default_device_pinned_mem_limit 0 6000M" in log  # the policy's value
    [resp] = plugin.kubelet.allocate("nvidia.com/gpu", [f"{u}::2"]).container_responses
    pipe = f"/mps/{u}/pipe"
    assert resp.envs["CUDA_MPS_PIPE_DIRECTORY"] == pipe
    mounts = {(m.container_path, m.host_path) for m in resp.mounts}
    assert (pipe, str(daemon.pipe_dir)) in mounts
    assert ("/dev/shm", "/dev/shm") in mounts
    # Exclusive GPUs on the same node get no MPS settings.
    [plain] = plugin.kubelet.allocate("nvidia.com/gpu", [plugin.uuid(0)]).container_responses
    assert "CUDA_MPS_PIPE_DIRECTORY" not in plain.envs


def test_dead_daemon_marks_replicas_unhealthy_and_is_restarted(run_plugin, mps_binary) -> None:
    plugin = run_plugin("a30x4", config=_mps_config(mps_binary, MPS))
    kubelet = plugin.kubelet
    u = plugin.uuid(1)
    replicas = [f"{u}::{n}" for n in range(4)]

    def all_(health):
        return lambda d: all(d.get(r, ("",))[0] == health for r in replicas)

    kubelet.wait_devices("nvidia.com/gpu", all_("Healthy"))
    daemon = plugin.manager.mps.daemon(u)
    first = daemon_pid(daemon.pipe_dir)
    os.kill(first, signal.SIGKILL)
    kubelet.wait_devices("nvidia.com/gpu", all_("Unhealthy"), 3.0)
    kubelet.wait_devices("nvidia.com/gpu", all_("Healthy"), 5.0)
    assert daemon_pid(daemon.pipe_dir) != first
    assert daemon.starts == 2


def test_missing_binary_withholds_replicas_with_a_reason(run_plugin, short_dir) -> None:
    plugin = run_plugin("a30x4", config=_mps_config(short_dir / "no-such-mps-control", MPS))
    u = plugin.uuid(1)
    devices = plugin.kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 7)
    assert {devices[f"{u}::{n}"][0] for n in range(4)} == {"Unhealthy"}
    assert "MPS daemon not answering" in (plugin.manager.mps.reason(u) or "")


def test_daemon_is_stopped_cleanly_on_shutdown(run_plugin, mps_binary) -> None:
    plugin = run_plugin("a30x4", config=_mps_config(mps_binary, MPS))
    u = plugin.uuid(1)
    plugin.kubelet.wait_devices("nvidia.com/gpu", lambda d: d.get(f"{u}::0", ("",))[0] == "Healthy")
    daemon = plugin.manager.mps.daemon(u)
    pid = daemon_pid(daemon.pipe_dir)
    plugin.manager.shutdown()
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.02)
    else:
        raise AssertionError("MPS daemon still running after shutdown")
    assert "quit" in (daemon.log_dir / "control.log").read_text().splitlines()
