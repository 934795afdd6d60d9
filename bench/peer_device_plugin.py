"""NVIDIA's device plugin beside nodeagent's, on one simulated node: latency and CDI generation.

    python bench/peer_device_plugin.py [--preset dgx-h100] [--calls 300]

Needs root (NVIDIA's plugin runs in ``nodeagent sim exec --driver``, a private mount namespace)
and ``make nvidia-peers libnvml``. Each plugin runs in a process of its own and registers with
its own test kubelet (nodeagent/testing/kubelet.py); the same requests go to both through their
unix sockets:
``Allocate`` of one or two random GPUs, and ``GetPreferredAllocation`` of two out of all GPUs.
CDI: ``nvidia-ctk cdi generate`` for the whole node against nodeagent's CDI spec for the same
devices (read through pynvml and built by ``nodeagent.cdi``), each as a fresh process in the same
namespace. Both read the same simulator (NVIDIA's through the C library, nodeagent's in Python),
so what the simulator costs is paid on both sides, and ratios are fair where absolute numbers
are not (a real driver answers faster than the simulator).

Not measured yet: preferred-allocation quality against an exhaustive optimum, XID 79 recovery,
and CPU/RSS.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nodeagent.kubelet.deviceplugin.v1beta1 import api_pb2
from nodeagent.testing.kubelet import TestKubelet

REPO = Path(__file__).resolve().parents[1]
NODEAGENT = Path(sys.executable).parent / "nodeagent"
RESOURCE = "nvidia.com/gpu"

_VIEW = """
import json
from pathlib import Path
import pynvml
from nodeagent.cdi import CdiDevice, CdiWriter
pynvml.nvmlInit()
devices = []
for i in range(pynvml.nvmlDeviceGetCount()):
    gpu = pynvml.nvmlDeviceGetHandleByIndex(i)
    uuid = pynvml.nvmlDeviceGetUUID(gpu)
    devices.append(CdiDevice(uuid, (uuid,), (pynvml.nvmlDeviceGetMinorNumber(gpu),)))
json.dumps(CdiWriter(Path("."), "nvidia.com").spec("node", devices))
"""


def quantiles_ms(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return (
        ordered[len(ordered) // 2] * 1000,
        ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
    )


def peers() -> Path:
    out = subprocess.run(
        ["bash", str(REPO / "hack/nvidia/build.sh"), "--dir"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip()) / "bin"


def latency(kubelet: TestKubelet, calls: int, rng: random.Random) -> dict[str, tuple[float, float]]:
    devices = sorted(kubelet.wait_devices(RESOURCE, timeout_s=30))
    stub = kubelet.stub(RESOURCE)
    allocate: list[float] = []
    preferred: list[float] = []
    for _ in range(calls):
        ids = rng.sample(devices, rng.choice((1, 2)))
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
        )
        start = time.perf_counter()
        stub.Allocate(request, timeout=5)
        allocate.append(time.perf_counter() - start)
        want = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=devices, allocation_size=2
                )
            ]
        )
        start = time.perf_counter()
        stub.GetPreferredAllocation(want, timeout=5)
        preferred.append(time.perf_counter() - start)
    return {"Allocate": quantiles_ms(allocate), "GetPreferredAllocation": quantiles_ms(preferred)}


def nvidias(
    bin_dir: Path, env: dict[str, str], directory: Path, calls: int
) -> dict[str, tuple[float, float]]:
    kubelet = TestKubelet(directory)
    kubelet.start()
    script = (
        f"mount -t tmpfs none /var/lib && mkdir -p /var/lib/kubelet && "
        f"ln -s {directory} /var/lib/kubelet/device-plugins && "
        f"exec {bin_dir / 'nvidia-device-plugin'} --kubelet-socket {kubelet.socket} "
        f'--mig-strategy none --driver-root "$NODEAGENT_SIM_DRIVER_ROOT"'
    )
    plugin = subprocess.Popen(
        [str(NODEAGENT), "sim", "exec", "--driver", "--", "sh", "-c", script],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        return latency(kubelet, calls, random.Random(1))
    finally:
        plugin.terminate()
        plugin.wait(10)
        kubelet.stop()


_PLUGIN = """
import signal, sys, threading
from pathlib import Path
from nodeagent.agent.backend import open_node
from nodeagent.config.schema import load_agent_config
from nodeagent.runtime.snapshots import SnapshotStore
from nodeagent_device_plugin.component import build
node = open_node(simulate=sys.argv[1], state_dir=Path(sys.argv[2]))
snapshots = SnapshotStore()
snapshots.publish(node.snapshot())
section = {"device_plugin": {"kubelet_dir": sys.argv[3]}}
config = load_agent_config(None, environ={}, overrides=section)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
build(config, snapshots, None).run(stop)
node.close()
"""


def nodeagents(
    state: Path, preset: str, directory: Path, calls: int
) -> dict[str, tuple[float, float]]:
    """nodeagent's device plugin component in a process of its own, as NVIDIA's runs."""
    kubelet = TestKubelet(directory)
    kubelet.start()
    plugin = subprocess.Popen(
        [sys.executable, "-c", _PLUGIN, preset, str(state), str(directory)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        return latency(kubelet, calls, random.Random(1))
    finally:
        plugin.terminate()
        plugin.wait(10)
        kubelet.stop()


def cdi_times(bin_dir: Path, env: dict[str, str], work: Path, runs: int) -> tuple[float, float]:
    """Median seconds of one nvidia-ctk run and one nodeagent spec build, as processes."""
    view = work / "view.py"
    view.write_text(_VIEW)
    ctk = (
        f'{bin_dir / "nvidia-ctk"} cdi generate --driver-root "$NODEAGENT_SIM_DRIVER_ROOT" '
        "--output /dev/null 2>/dev/null"
    )
    script = (
        f"for i in $(seq {runs}); do "
        f"a=$(date +%s%N); {ctk}; b=$(date +%s%N); python {view}; c=$(date +%s%N); "
        f'echo "$((b - a)) $((c - b))"; done'
    )
    out = subprocess.run(
        [str(NODEAGENT), "sim", "exec", "--driver", "--", "sh", "-c", script],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    pairs = [tuple(int(x) / 1e9 for x in line.split()) for line in out if line.strip()]
    ctk_s = sorted(p[0] for p in pairs)[len(pairs) // 2]
    ours_s = sorted(p[1] for p in pairs)[len(pairs) // 2]
    return ctk_s, ours_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="dgx-h100")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--cdi-runs", type=int, default=5)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("peer_device_plugin: needs root (NVIDIA's plugin runs in a mount namespace)")
    bin_dir = peers()
    if not (bin_dir / "nvidia-device-plugin").is_file():
        sys.exit("peer_device_plugin: NVIDIA's tools are not built; run make nvidia-peers")
    with tempfile.TemporaryDirectory(prefix="peer-bench-", dir="/tmp") as tmp:
        work = Path(tmp)
        state = work / "node"
        env = {**os.environ, "NODEAGENT_SIM_STATE": str(state), "NODEAGENT_SIMULATE": args.preset}
        subprocess.run([str(NODEAGENT), "gpus"], env=env, capture_output=True, check=True)
        theirs = nvidias(bin_dir, env, work / "nvidia", args.calls)
        ours = nodeagents(state, args.preset, work / "nodeagent", args.calls)
        ctk_s, ours_s = cdi_times(bin_dir, env, work, args.cdi_runs)
    print(f"preset {args.preset}, {args.calls} calls each, one simulated node\n")
    print("| measure | NVIDIA's plugin | nodeagent |")
    print("|---|---|---|")
    for name in ("Allocate", "GetPreferredAllocation"):
        a, b = theirs[name], ours[name]
        print(f"| {name} p50 / p99 | {a[0]:.2f} / {a[1]:.2f} ms | {b[0]:.2f} / {b[1]:.2f} ms |")
    print(f"| CDI spec for the node (process, median) | {ctk_s:.2f} s | {ours_s:.2f} s |")


if __name__ == "__main__":
    main()
