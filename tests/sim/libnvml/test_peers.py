"""NVIDIA's nvidia-ctk, unmodified, on a simulated node (``nodeagent sim exec --driver``).

For every preset, before and after a MIG layout is applied, ``nvidia-ctk cdi generate`` must
list the node's GPUs and MIG devices with the device nodes nodeagent's own CDI spec gives each
(read in the same namespace, from the same driver files). By-design differences are named in
docs/simulator.md and left out here: nodeagent sets ``NVIDIA_VISIBLE_DEVICES`` per device and
leaves ``/dev/nvidia-modeset`` out of its control nodes. Needs root (a private mount namespace)
and the peers built by ``make nvidia-peers``; with ``CI=true`` their absence fails.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from nodeagent.cdi import CONTROL_NODES
from nodeagent.sim import presets

REPO = Path(__file__).resolve().parents[3]
NODEAGENT = Path(sys.executable).parent / "nodeagent"

# nodeagent's CDI view of the node, printed from inside the namespace (pynvml is the simulator
# there, and /proc/driver holds the simulated driver's capability files).
_NODEAGENT_VIEW = """
import json
from pathlib import Path
import pynvml
from nodeagent.cdi import CdiDevice, CdiWriter, mig_cap_minors
caps = Path("/proc/driver/nvidia/capabilities")
pynvml.nvmlInit()
devices = []
for i in range(pynvml.nvmlDeviceGetCount()):
    gpu = pynvml.nvmlDeviceGetHandleByIndex(i)
    minor, uuid = pynvml.nvmlDeviceGetMinorNumber(gpu), pynvml.nvmlDeviceGetUUID(gpu)
    try:
        enabled = pynvml.nvmlDeviceGetMigMode(gpu)[0]
    except pynvml.NVMLError_NotSupported:
        enabled = 0
    if not enabled:  # a GPU in MIG mode is offered only as its MIG devices
        devices.append(CdiDevice(uuid, (uuid,), (minor,)))
    for m in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu) if enabled else 0):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, m)
        except pynvml.NVMLError_NotFound:
            continue
        gi = pynvml.nvmlDeviceGetGpuInstanceId(mig)
        ci = pynvml.nvmlDeviceGetComputeInstanceId(mig)
        mig_uuid = pynvml.nvmlDeviceGetUUID(mig)
        devices.append(
            CdiDevice(mig_uuid, (mig_uuid,), (minor,), mig_cap_minors(caps, minor, gi, ci))
        )
print(json.dumps(CdiWriter(Path("."), "nvidia.com").spec("node", devices)))
"""


def _nodes(edits: dict[str, Any]) -> set[str]:
    return {n["path"] for n in edits.get("deviceNodes", [])}


def _generate(env: dict[str, str], ctk: Path, tmp_path: Path) -> tuple[dict[str, Any], ...]:
    view = tmp_path / "view.py"
    view.write_text(_NODEAGENT_VIEW)
    script = (
        f'"{ctk}" cdi generate --driver-root "$NODEAGENT_SIM_DRIVER_ROOT" --format json '
        f'--device-name-strategy uuid --output "{tmp_path}/ctk.json" 2>"{tmp_path}/ctk.log" && '
        f'python "{view}" >"{tmp_path}/nodeagent.json"'
    )
    subprocess.run(
        [str(NODEAGENT), "sim", "exec", "--driver", "--", "sh", "-c", script],
        env=env,
        check=True,
        timeout=120,
    )
    return (
        json.loads((tmp_path / "ctk.json").read_text()),
        json.loads((tmp_path / "nodeagent.json").read_text()),
    )


def _check(ctk_spec: dict[str, Any], ours: dict[str, Any]) -> int:
    theirs = {d["name"]: _nodes(d["containerEdits"]) for d in ctk_spec["devices"]}
    assert theirs.pop("all") == set().union(*theirs.values())
    mine = {d["name"].removeprefix("node-"): _nodes(d["containerEdits"]) for d in ours["devices"]}
    assert theirs == mine
    assert set(CONTROL_NODES) <= _nodes(ctk_spec["containerEdits"])
    return sum(1 for name in mine if name.startswith("MIG-"))


@pytest.mark.parametrize("preset", sorted(presets.PRESETS))
def test_nvidia_ctk_lists_what_nodeagent_would_inject(
    preset: str, nvidia_ctk: Path, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "NODEAGENT_SIM_STATE": str(tmp_path / "node"),
        "NODEAGENT_SIMULATE": preset,
    }
    (tmp_path / "off").mkdir()
    assert _check(*_generate(env, nvidia_ctk, tmp_path / "off")) == 0
    gpus = json.loads(
        subprocess.run(
            [str(NODEAGENT), "gpus", "--json"], env=env, capture_output=True, text=True, check=True
        ).stdout
    )
    if not any(g["mig_capable"] for g in gpus):
        return
    applied = subprocess.run(
        [str(NODEAGENT), "mig", "apply", "-c", "all-balanced", "--yes"],
        env=env,
        capture_output=True,
        check=False,
    )
    if applied.returncode != 0:  # GPUs the shipped balanced layout has no entry for
        subprocess.run(
            [str(NODEAGENT), "mig", "apply", "-c", "all-7g", "--yes"],
            env=env,
            capture_output=True,
            check=False,
        )
    (tmp_path / "on").mkdir()
    mig_devices = _check(*_generate(env, nvidia_ctk, tmp_path / "on"))
    if applied.returncode == 0:
        assert mig_devices > 0


def test_driver_root_lays_out_libraries_nodes_and_mig_files(
    nvidia_ctk: Path, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "NODEAGENT_SIM_STATE": str(tmp_path / "node"),
        "NODEAGENT_SIMULATE": "a30x4",
    }
    subprocess.run(
        [str(NODEAGENT), "mig", "apply", "-c", "all-1g", "--yes"],
        env=env,
        capture_output=True,
        check=True,
    )
    root = tmp_path / "root"
    subprocess.run(
        [str(NODEAGENT), "sim", "driver-root", str(root)], env=env, check=True, capture_output=True
    )
    libs = next(root.glob("usr/lib/*"))
    assert (libs / "libnvidia-ml.so.1").resolve() == libs / "libnvidia-ml.so.570.124.06"
    assert (libs / "libcuda.so.1").resolve() == libs / "libcuda.so.570.124.06"
    gpu0 = (root / "dev" / "nvidia0").stat()
    assert stat.S_ISCHR(gpu0.st_mode)
    assert (os.major(gpu0.st_rdev), os.minor(gpu0.st_rdev)) == (195, 0)
    minors = dict(
        line.split()
        for line in (root / "proc/driver/nvidia-caps/mig-minors").read_text().splitlines()
    )
    shown = json.loads(
        subprocess.run(
            [str(NODEAGENT), "mig", "show", "--json"], env=env, capture_output=True, check=True
        ).stdout
    )
    for gi in shown["gpus"][0]["instances"]:
        access = root / f"proc/driver/nvidia/capabilities/gpu0/mig/gi{gi['instance_id']}/access"
        minor = int(minors[f"gpu0/gi{gi['instance_id']}/access"])
        assert f"DeviceFileMinor: {minor}\n" in access.read_text()
        cap = (root / "dev" / "nvidia-caps" / f"nvidia-cap{minor}").stat()
        assert stat.S_ISCHR(cap.st_mode)
        assert os.minor(cap.st_rdev) == minor


def test_driver_needs_a_compiler_and_says_so_in_one_line(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "NODEAGENT_SIM_STATE": str(tmp_path / "node"),
        "NODEAGENT_SIMULATE": "t4",
        "CC": "no-such-cc",
        "NODEAGENT_LIBNVML_CACHE": str(tmp_path / "cache"),
    }
    done = subprocess.run(
        [str(NODEAGENT), "sim", "exec", "--driver", "--", "true"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines()[0] == (
        "error: cannot build the simulated libnvidia-ml.so.1: no C compiler 'no-such-cc': "
        "install gcc (apt-get install gcc) or set CC"
    )


def test_stopping_exec_stops_the_program(nvidia_ctk: Path, tmp_path: Path) -> None:
    env = {**os.environ, "NODEAGENT_SIM_STATE": str(tmp_path / "node"), "NODEAGENT_SIMULATE": "t4"}
    running = subprocess.Popen(
        [str(NODEAGENT), "sim", "exec", "--driver", "--", "sh", "-c", "echo $$; exec sleep 60"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert running.stdout is not None
        program = int(running.stdout.readline())
        running.terminate()
        running.wait(10)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and Path(f"/proc/{program}").exists():
            time.sleep(0.05)
        assert not Path(f"/proc/{program}").exists()
    finally:
        if running.poll() is None:
            running.kill()
            running.wait()
