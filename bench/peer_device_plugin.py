"""NVIDIA's device plugin beside nodeagent's, on one simulated node: latency, XID 79, CPU/RSS, CDI.

    python bench/peer_device_plugin.py [--preset dgx-h100] [--calls 1000] [--idle-s 60]

Needs root (NVIDIA's plugin runs in ``nodeagent sim exec --driver``, a private mount namespace)
and ``make nvidia-peers libnvml``. Each plugin runs in a process of its own and registers with
its own test kubelet (nodeagent/testing/kubelet.py): NVIDIA's k8s-device-plugin, and
``nodeagent run`` (sampler, health and device plugin; metrics off, short recovery
periods so that recovery fits in the run) with its Allocate front, as the container image runs
it (``make device-plugin-front``; its CPU and RSS are counted with the agent's). A second
``nodeagent run`` without the front, answering Allocate in Python, takes part in the latency
calls only. Both run at the same time on the same simulated
node, and every measure is taken of both in the same window, so that what else the machine
does falls on both alike:

- ``Allocate`` of one or two random GPUs, and ``GetPreferredAllocation`` of two out of all GPUs,
  through their unix sockets, the calls to the two plugins interleaved (the same request to
  each, in a fresh random order each time) (p50 / p99), and Allocate's p50 by the server
  called just before (which one goes first matters: see ``latency``);
- XID 79 on one GPU, injected through the simulator's control API (the state-file write that
  ``nodeagent sim inject`` makes): time until each test kubelet's ListAndWatch stream shows
  that GPU Unhealthy, how many devices went Unhealthy, and, after ``clear``, time until it is
  Healthy again (or "never" within ``--recover-s``); a plugin that never recovers sits out the
  later rounds;
- CPU seconds per minute (utime + stime from /proc/PID/stat) and RSS (VmRSS, sampled each
  second) of each plugin's own process, idle for ``--idle-s`` and under an XID storm (XIDs 13,
  31, 43, 63 and 94 round-robin on four GPUs, 20 a second, for ``--storm-s``);
- CDI: ``nvidia-ctk cdi generate`` for the whole node against nodeagent's CDI spec for the same
  devices (read through pynvml and built by ``nodeagent.cdi``), each as a fresh process.

- the floor: a bare server of nodeagent's own gRPC stack (grpcio's sync server with the device
  plugin's thread pool) that answers every ``Allocate`` with nodeagent's serialized answer to a
  2-GPU request, parsing and checking nothing; interleaved with the two plugins' ``Allocate``
  calls. What any device plugin served by grpcio pays per call, whatever its own work.

Both read the same simulator (NVIDIA's through the C library, which runs the Python simulator
inside the plugin's process; nodeagent's in Python), so what the simulator costs is paid on
both sides, and ratios are fairer than absolute numbers (a real driver answers faster).
Preferred-allocation quality is bench/peer_allocation.py.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import grpc

from nodeagent.kubelet.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from nodeagent.sim.control import SimControl
from nodeagent.testing.kubelet import TestKubelet

REPO = Path(__file__).resolve().parents[1]
NODEAGENT = Path(sys.executable).parent / "nodeagent"
RESOURCE = "nvidia.com/gpu"
HEALTHY = "Healthy"
TICK = os.sysconf("SC_CLK_TCK")
UNHEALTHY_WAIT_S = 30.0

# nodeagent's config for the run: no metrics port, and recovery periods short enough to watch a
# recovery (defaults: a fatal XID holds 1 h, then 300 s and 60 s quiet). The hold must stay
# above 0: with 0 the XID's fault expires as it is recorded and only the next sample (GPU lost)
# withdraws the GPU. NVIDIA's plugin has no equivalent to shorten.
AGENT_CONFIG = """version: v1
metrics: {enabled: false}
health:
  recovery_quiet_s: 2
  fatal_hold_s: 1
device_plugin:
  health_recovery_quiet_s: 0
"""

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


@dataclass
class Running:
    """One plugin registered with its test kubelet."""

    name: str
    kubelet: TestKubelet
    pid: int  # the plugin's own process (not the namespace wrapper)


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


def _children(pid: int) -> list[int]:
    """The children of every thread of ``pid`` (the agent starts its front from a worker)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found.extend(int(p) for p in (task / "children").read_text().split())
        except OSError:
            continue
    return found


def _find(root: int, exe_name: str, timeout_s: float = 30) -> int:
    """The descendant of ``root`` running ``exe_name`` (``sim exec`` forks before it execs)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        todo = [root]
        while todo:
            pid = todo.pop()
            try:
                if Path(os.readlink(f"/proc/{pid}/exe")).name == exe_name:
                    return pid
            except OSError:
                pass
            todo.extend(_children(pid))
        time.sleep(0.1)
    raise SystemExit(f"peer_device_plugin: no {exe_name} process started under pid {root}")


@contextmanager
def _serving(
    name: str, directory: Path, argv: list[str], env: dict[str, str], exe: str | None
) -> Iterator[Running]:
    kubelet = TestKubelet(directory)
    kubelet.start()
    log = (directory / "plugin.log").open("wb")
    plugin = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        pid = _find(plugin.pid, exe) if exe else plugin.pid
        kubelet.wait_devices(RESOURCE, timeout_s=60)
        yield Running(name, kubelet, pid)
    finally:
        plugin.terminate()
        try:
            plugin.wait(15)
        except subprocess.TimeoutExpired:
            plugin.kill()
            plugin.wait(5)
        log.close()
        kubelet.stop()


@contextmanager
def nvidia(bin_dir: Path, env: dict[str, str], directory: Path) -> Iterator[Running]:
    """NVIDIA's plugin in a private mount namespace over the simulated libnvidia-ml.so.1."""
    directory.mkdir(parents=True, exist_ok=True)
    script = (
        f"mount -t tmpfs none /var/lib && mkdir -p /var/lib/kubelet && "
        f"ln -s {directory} /var/lib/kubelet/device-plugins && "
        f"exec {bin_dir / 'nvidia-device-plugin'} --kubelet-socket {directory / 'kubelet.sock'} "
        f'--mig-strategy none --driver-root "$NODEAGENT_SIM_DRIVER_ROOT"'
    )
    argv = [str(NODEAGENT), "sim", "exec", "--driver", "--", "sh", "-c", script]
    with _serving("NVIDIA", directory, argv, env, "nvidia-device-plugin") as running:
        yield running


@contextmanager
def nodeagent(env: dict[str, str], directory: Path, front: Path | None) -> Iterator[Running]:
    """``nodeagent run`` on the same simulated node (its state directory comes from ``env``),
    with the Allocate front as the container image runs it, or (None) answering Allocate itself."""
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "agent.yaml"
    config.write_text(AGENT_CONFIG + (f"  allocate_front: {front}\n" if front else ""))
    argv = [
        sys.executable,
        "-m",
        "nodeagent.cli.main",
        "run",
        "--config",
        str(config),
        "--agent-state-dir",
        str(directory / "agent"),
        "--kubelet-dir",
        str(directory),
        "--mig-lock-file",
        str(directory / "mig.lock"),
    ]
    name = "nodeagent" if front else "nodeagent, Allocate in Python"
    with _serving(name, directory, argv, env, None) as running:
        yield running


def front_program() -> Path:
    """nodeagent-device-plugin-front, built by ``make device-plugin-front``."""
    out = subprocess.run(
        ["bash", str(REPO / "device_plugin/front/build.sh"), "--path"],
        capture_output=True,
        text=True,
        check=True,
    )
    program = Path(out.stdout.strip())
    if not program.is_file():
        die("the Allocate front is not built; run make device-plugin-front")
    return program


# The floor's server: grpcio's sync server as device_plugin/server.py builds it, one generic
# handler that returns fixed bytes (no deserializer, so the request is not even parsed).
_FLOOR = """
import sys
from concurrent import futures
from pathlib import Path
import grpc
from nodeagent_device_plugin.server import MAX_WORKERS
answer = Path(sys.argv[2]).read_bytes()
allocate = grpc.unary_unary_rpc_method_handler(lambda request, context: answer)
server = grpc.server(futures.ThreadPoolExecutor(max_workers=MAX_WORKERS))
server.add_generic_rpc_handlers(
    (grpc.method_handlers_generic_handler("v1beta1.DevicePlugin", {"Allocate": allocate}),)
)
server.add_insecure_port("unix://" + sys.argv[1])
server.start()
server.wait_for_termination()
"""


@contextmanager
def floor_server(directory: Path, answer: bytes) -> Iterator[api_pb2_grpc.DevicePluginStub]:
    """The bare grpcio server answering ``answer`` to every Allocate, and a stub for it."""
    directory.mkdir(parents=True, exist_ok=True)
    socket, answer_file = directory / "floor.sock", directory / "answer.bin"
    answer_file.write_bytes(answer)
    server = subprocess.Popen([sys.executable, "-c", _FLOOR, str(socket), str(answer_file)])
    channel = grpc.insecure_channel(f"unix://{socket}")
    try:
        try:
            grpc.channel_ready_future(channel).result(timeout=30)
        except grpc.FutureTimeoutError:
            die(f"the floor's bare grpcio server did not answer on {socket} within 30 s")
        yield api_pb2_grpc.DevicePluginStub(channel)
    finally:
        channel.close()
        server.terminate()
        server.wait(15)


def floor_answer(run: Running) -> bytes:
    """The plugin's serialized answer to Allocate of two GPUs: the size the floor sends."""
    devices = sorted(run.kubelet.wait_devices(RESOURCE, timeout_s=30))
    return run.kubelet.allocate(RESOURCE, devices[:2]).SerializeToString()


@dataclass
class Latency:
    """Seconds per call: each run's, by method, and the floor's Allocate."""

    runs: list[dict[str, list[float]]]
    floor: list[float]
    # Allocate by (server, the server called just before it; -1: none); the floor is the last
    # index
    after: dict[tuple[int, int], list[float]]


def latency(
    runs: list[Running], floor: api_pb2_grpc.DevicePluginStub, calls: int, rng: random.Random
) -> Latency:
    """The same requests to each run (and Allocate to the floor), interleaved call by call."""
    devices = sorted(runs[0].kubelet.wait_devices(RESOURCE, timeout_s=30))
    for run in runs[1:]:
        if sorted(run.kubelet.wait_devices(RESOURCE, timeout_s=30)) != devices:
            die(f"{run.name} advertises other devices than {runs[0].name}")
    stubs = [run.kubelet.stub(RESOURCE) for run in runs]
    times: list[dict[str, list[float]]] = [
        {"Allocate": [], "GetPreferredAllocation": []} for _ in runs
    ]
    floor_times: list[float] = []
    after: dict[tuple[int, int], list[float]] = {}
    want = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=devices, allocation_size=2
            )
        ]
    )
    requests = [
        api_pb2.AllocateRequest(
            container_requests=[
                api_pb2.ContainerAllocateRequest(
                    devices_ids=rng.sample(devices, rng.choice((1, 2)))
                )
            ]
        )
        for _ in range(calls)
    ]
    # One method at a time: NVIDIA's GetPreferredAllocation runs the simulator for tens of
    # milliseconds, which would land on whichever call came next.
    for method, each in (("Allocate", requests), ("GetPreferredAllocation", [want] * calls)):
        called = [getattr(stub, method) for stub in stubs]
        kept = [run_times[method] for run_times in times]
        if method == "Allocate":
            called.append(floor.Allocate)
            kept.append(floor_times)
        previous = -1
        for request in each:
            # A fresh random order for every request: a server called right after itself finds
            # its code and data still in the CPU's caches, and one called right after a Python
            # server shares the cores with that server's work after its answer. A fixed or
            # alternating order hands those to the same servers every time.
            order = list(range(len(called)))
            rng.shuffle(order)
            for i in order:
                start = time.perf_counter()
                called[i](request, timeout=5)
                took = time.perf_counter() - start
                kept[i].append(took)
                if method == "Allocate":
                    after.setdefault((i, previous), []).append(took)
                previous = i
    return Latency(times, floor_times, after)


@dataclass
class XidResult:
    unhealthy_s: float | None  # injection -> that GPU Unhealthy on ListAndWatch
    unhealthy_count: int  # devices Unhealthy 1 s after this plugin noticed, the GPU included
    recovered_s: float | None  # clear -> Healthy again; None: never within the wait


def xid79(
    runs: list[Running], control: SimControl, gpu: int, uuid: str, recover_s: float
) -> list[XidResult]:
    """XID 79 (fallen off the bus) on ``gpu``, seen by every run; then clear it and wait."""

    def health(run: Running) -> dict[str, str]:
        return {k: v[0] for k, v in run.kubelet.plugins[RESOURCE].devices.items()}

    for run in runs:
        run.kubelet.wait_devices(RESOURCE, lambda d: all(v[0] == HEALTHY for v in d.values()), 30)
    start = time.monotonic()
    control.inject("xid", gpu, code=79)
    unhealthy = _first_times(
        runs, lambda run: health(run).get(uuid) not in (None, HEALTHY), start, UNHEALTHY_WAIT_S
    )
    # Each plugin's count is taken 1 s after its own notice, so that a plugin that withdraws
    # more than one device has finished doing so (one that never noticed is counted now).
    counts = [0] * len(runs)
    for i in sorted(range(len(runs)), key=lambda i: unhealthy[i] or 0.0):
        time.sleep(max(0.0, start + (unhealthy[i] or 0.0) + 1.0 - time.monotonic()))
        counts[i] = sum(v != HEALTHY for v in health(runs[i]).values())
    start = time.monotonic()
    control.clear(gpu)
    back = _first_times(runs, lambda run: health(run).get(uuid) == HEALTHY, start, recover_s)
    return [XidResult(u, c, b) for u, c, b in zip(unhealthy, counts, back, strict=True)]


def _first_times(
    runs: list[Running], seen: Callable[[Running], bool], start: float, limit_s: float
) -> list[float | None]:
    """Seconds from ``start`` until ``seen(run)`` first held, per run; None: not in the limit."""
    found: list[float | None] = [None] * len(runs)
    while time.monotonic() - start < limit_s and None in found:
        for i, run in enumerate(runs):
            if found[i] is None and seen(run):
                found[i] = time.monotonic() - start
        time.sleep(0.002)
    return found


@dataclass
class Usage:
    cpu_s_per_min: float
    cpu_p50: float  # per-second samples, CPU seconds per second
    cpu_p99: float
    rss_median_mib: float
    rss_peak_mib: float


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (nodeagent's Allocate front is its child)."""
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo.extend(_children(found[-1]))
    return found


def _cpu_ticks(pid: int) -> int:
    """utime + stime of ``pid`` and its children now (fields 14 and 15 of stat)."""
    total = 0
    for each in _tree(pid):
        try:
            fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # it ended meanwhile
            continue
        total += int(fields[11]) + int(fields[12])
    return total


def _rss_kib(pid: int) -> int:
    """VmRSS of ``pid`` and its children."""
    total = 0
    for each in _tree(pid):
        try:
            lines = Path(f"/proc/{each}/status").read_text().splitlines()
        except OSError:
            continue
        total += sum(int(line.split()[1]) for line in lines if line.startswith("VmRSS:"))
    return total


def usage(
    pids: list[int], seconds: float, load: Callable[[threading.Event], None] | None
) -> list[Usage]:
    """CPU and RSS of each of ``pids`` over the same ``seconds``, sampled each second, ``load``
    running meanwhile."""
    stop = threading.Event()
    worker = threading.Thread(target=load, args=(stop,), daemon=True) if load else None
    if worker:
        worker.start()
    per_s: list[list[float]] = [[] for _ in pids]
    rss: list[list[int]] = [[] for _ in pids]
    first = [_cpu_ticks(pid) for pid in pids]
    last = list(first)
    began = previous = time.monotonic()
    while time.monotonic() - began < seconds:
        time.sleep(1)
        now = time.monotonic()
        for i, pid in enumerate(pids):
            ticks = _cpu_ticks(pid)
            per_s[i].append((ticks - last[i]) / TICK / (now - previous))
            rss[i].append(_rss_kib(pid))
            last[i] = ticks
        previous = now
    stop.set()
    if worker:
        worker.join()
    elapsed = time.monotonic() - began
    found = []
    for i in range(len(pids)):
        ordered = sorted(per_s[i])
        found.append(
            Usage(
                (last[i] - first[i]) / TICK / elapsed * 60,
                ordered[len(ordered) // 2],
                ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
                statistics.median(rss[i]) / 1024,
                max(rss[i]) / 1024,
            )
        )
    return found


STORM_XIDS = (13, 31, 43, 63, 94)


def storm(control: SimControl, gpus: list[int]) -> Callable[[threading.Event], None]:
    """XIDs round-robin over ``gpus``, 20 a second, until stopped; faults cleared at the end."""

    def run(stop: threading.Event) -> None:
        n = 0
        while not stop.wait(0.05):
            control.inject("xid", gpus[n % len(gpus)], code=STORM_XIDS[n % len(STORM_XIDS)])
            n += 1
        for gpu in gpus:
            control.clear(gpu)

    return run


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


def gpu_uuids(env: dict[str, str]) -> list[str]:
    """GPU UUIDs by index, as ``nodeagent gpus --json`` reports them."""
    import json

    out = subprocess.run(
        [str(NODEAGENT), "gpus", "--json"], env=env, capture_output=True, text=True, check=True
    )
    return [g["uuid"] for g in sorted(json.loads(out.stdout), key=lambda g: g["index"])]


def die(message: str) -> NoReturn:
    """Bad input or a missing prerequisite: one line on stderr, exit 2."""
    print(f"{Path(sys.argv[0]).stem}: {message}", file=sys.stderr)
    raise SystemExit(2)


def stop_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so that both plugins and their kubelets are stopped."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("peer_device_plugin: terminated"))


def setup(preset: str, work: Path) -> tuple[Path, dict[str, str], Path]:
    """The peers' bin directory, the environment naming the simulated node, its state dir."""
    if os.geteuid() != 0:
        die("needs root (NVIDIA's plugin runs in a mount namespace); run it with sudo")
    bin_dir = peers()
    if not (bin_dir / "nvidia-device-plugin").is_file():
        die("NVIDIA's tools are not built; run make nvidia-peers libnvml")
    state = work / "node"
    env = {**os.environ, "NODEAGENT_SIM_STATE": str(state), "NODEAGENT_SIMULATE": preset}
    made = subprocess.run([str(NODEAGENT), "gpus"], env=env, capture_output=True, text=True)
    if made.returncode != 0:  # an unknown preset, say: nodeagent's own one-line reason
        why = (made.stderr.strip() or made.stdout.strip() or "nodeagent gpus failed").splitlines()
        die(f"--preset {preset}: {why[-1]}")
    return bin_dir, env, state


@dataclass
class Measured:
    """Everything measured for one plugin."""

    allocate: tuple[float, float]
    preferred: tuple[float, float]
    idle: Usage
    xid: list[XidResult]  # one per round; rounds stop at the first that never recovers
    storm: Usage


@dataclass
class Latencies:
    """p50 / p99 of nodeagent answering Allocate in Python, and of the floor's Allocate."""

    python_allocate: tuple[float, float]
    python_preferred: tuple[float, float]
    floor: tuple[float, float]
    # Allocate p50 (ms) and calls, by server and the server called just before it
    by_previous: dict[tuple[str, str], tuple[float, int]]


def measure(
    runs: list[Running],
    timed: Running,
    floor: api_pb2_grpc.DevicePluginStub,
    control: SimControl,
    uuids: list[str],
    args: argparse.Namespace,
) -> tuple[list[Measured], Latencies]:
    """Every measure, of all ``runs`` in the same window; the latencies of ``timed`` (in the
    same calls) and of the floor."""
    calls = latency([*runs, timed], floor, args.calls, random.Random(1))
    times = calls.runs
    pids = [run.pid for run in runs]
    idle = usage(pids, args.idle_s, None)
    # Before the storm: NVIDIA's plugin never marks a device healthy again. A plugin whose
    # device did not come back sits out the later rounds.
    xid: list[list[XidResult]] = [[] for _ in runs]
    for _ in range(args.xid_rounds):
        going = [
            i for i, rounds in enumerate(xid) if not rounds or rounds[-1].recovered_s is not None
        ]
        if not going:
            break
        gpu = args.xid_gpu
        found = xid79([runs[i] for i in going], control, gpu, uuids[gpu], args.recover_s)
        for i, result in zip(going, found, strict=True):
            xid[i].append(result)
    storm_gpus = [g for g in range(min(len(uuids), 5)) if g != args.xid_gpu][:4]
    loaded = usage(pids, args.storm_s, storm(control, storm_gpus))
    measured = [
        Measured(
            quantiles_ms(times[i]["Allocate"]),
            quantiles_ms(times[i]["GetPreferredAllocation"]),
            idle[i],
            xid[i],
            loaded[i],
        )
        for i in range(len(runs))
    ]
    extra = calls.runs[len(runs)]
    names = [run.name for run in (*runs, timed)] + ["the floor"]
    by_previous = {
        (names[i], names[before] if before >= 0 else "none"): (
            quantiles_ms(took)[0],
            len(took),
        )
        for (i, before), took in calls.after.items()
    }
    return measured, Latencies(
        quantiles_ms(extra["Allocate"]),
        quantiles_ms(extra["GetPreferredAllocation"]),
        quantiles_ms(calls.floor),
        by_previous,
    )


def _ratio(ours: float, theirs: float) -> str:
    return f"{ours / theirs:.2f}" if theirs > 0 else "- (NVIDIA's 0)"


def _ms(pair: tuple[float, float]) -> str:
    return f"{pair[0]:.2f} / {pair[1]:.2f} ms"


def _s(value: float | None, never: str) -> str:
    return never if value is None else f"{value:.2f} s"


def by_previous_table(extra: Latencies) -> None:
    """Allocate's p50 for each plugin by the server called just before it."""
    # Which server was called just before moves a server's latency; with the order random,
    # each plugin meets each predecessor about equally often, and this shows by how much.
    servers = sorted({server for server, _ in extra.by_previous})
    plugins = [name for name in servers if not name.startswith(("nodeagent,", "the floor"))]
    print("\n| Allocate p50 (calls), by the call just before | " + " | ".join(plugins) + " |")
    print("|---|" + "---|" * len(plugins))
    for before in [*servers, "none"]:
        cells = [extra.by_previous.get((name, before)) for name in plugins]
        if any(cells):
            shown = [f"{c[0]:.3f} ms ({c[1]})" if c else "" for c in cells]
            print(f"| after {before} | " + " | ".join(shown) + " |")


def report(
    a: Measured,
    b: Measured,
    extra: Latencies,
    cdi: tuple[float, float],
    args: argparse.Namespace,
) -> None:
    """The table: NVIDIA's plugin (a), nodeagent with its Allocate front (b), and their ratio;
    nodeagent answering Allocate in Python, and the grpcio floor."""
    print(
        f"preset {args.preset}, {args.calls} calls each, interleaved; both plugins at once on one"
    )
    print("simulated node and both pay the same simulator (NVIDIA's through the C library in its")
    print("own process), so compare ratios rather than absolute numbers\n")
    print("| measure | NVIDIA's plugin | nodeagent | nodeagent / NVIDIA |")
    print("|---|---|---|---|")
    for name, x, y in (
        ("Allocate", a.allocate, b.allocate),
        (
            "Allocate, nodeagent answering it in Python (no front)",
            a.allocate,
            extra.python_allocate,
        ),
        ("Allocate, a bare grpcio server answering fixed bytes", a.allocate, extra.floor),
        ("GetPreferredAllocation", a.preferred, b.preferred),
        ("GetPreferredAllocation, no front", a.preferred, extra.python_preferred),
    ):
        theirs = _ms(x) if "," not in name else ""
        print(f"| {name} p50 / p99 | {theirs} | {_ms(y)} | {y[0] / x[0]:.2f} / {y[1] / x[1]:.2f} |")

    def xids(rounds: list[XidResult], what: str, limit_s: float) -> str:
        values = [getattr(r, what) for r in rounds]
        if None in values:
            done = [v for v in values if v is not None]
            return f"never ({limit_s:.0f} s)" + (f" after {len(done)} round(s)" if done else "")
        ordered = sorted(values)
        return f"{ordered[len(ordered) // 2]:.2f} / {ordered[-1]:.2f} s ({len(ordered)} rounds)"

    count_a = max(r.unhealthy_count for r in a.xid)
    count_b = max(r.unhealthy_count for r in b.xid)
    print(
        f"| XID 79 on GPU {args.xid_gpu} -> Unhealthy on ListAndWatch, median / max | "
        f"{xids(a.xid, 'unhealthy_s', UNHEALTHY_WAIT_S)}; {count_a} device(s) Unhealthy | "
        f"{xids(b.xid, 'unhealthy_s', UNHEALTHY_WAIT_S)}; {count_b} device(s) Unhealthy | |"
    )
    print(
        "| cleared -> that GPU Healthy again, median / max | "
        f"{xids(a.xid, 'recovered_s', args.recover_s)} | "
        f"{xids(b.xid, 'recovered_s', args.recover_s)} | |"
    )
    for label, ua, ub in (
        (f"idle {args.idle_s:.0f} s", a.idle, b.idle),
        (f"XID storm {args.storm_s:.0f} s", a.storm, b.storm),
    ):
        print(
            f"| CPU, {label}: s per minute (per-second p50 / p99) | "
            f"{ua.cpu_s_per_min:.2f} ({ua.cpu_p50:.3f} / {ua.cpu_p99:.3f}) | "
            f"{ub.cpu_s_per_min:.2f} ({ub.cpu_p50:.3f} / {ub.cpu_p99:.3f}) | "
            f"{_ratio(ub.cpu_s_per_min, ua.cpu_s_per_min)} |"
        )
        print(
            f"| RSS, {label}: median / peak | "
            f"{ua.rss_median_mib:.0f} / {ua.rss_peak_mib:.0f} MiB | "
            f"{ub.rss_median_mib:.0f} / {ub.rss_peak_mib:.0f} MiB | "
            f"{ub.rss_median_mib / ua.rss_median_mib:.2f} |"
        )
    ctk_s, ours_s = cdi
    print(
        f"| CDI spec for the node (process, median) | {ctk_s:.2f} s | {ours_s:.2f} s | "
        f"{ours_s / ctk_s:.2f} |"
    )
    print()
    by_previous_table(extra)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--preset", default="dgx-h100")
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--cdi-runs", type=int, default=5)
    parser.add_argument("--idle-s", type=float, default=60)
    parser.add_argument("--storm-s", type=float, default=30)
    parser.add_argument("--recover-s", type=float, default=30)
    parser.add_argument("--xid-gpu", type=int, default=3)
    parser.add_argument("--xid-rounds", type=int, default=5)
    args = parser.parse_args()
    stop_on_sigterm()
    with tempfile.TemporaryDirectory(prefix="peer-bench-", dir="/tmp") as tmp:
        work = Path(tmp)
        bin_dir, env, state = setup(args.preset, work)
        control = SimControl(state)
        uuids = gpu_uuids(env)
        if not 0 <= args.xid_gpu < len(uuids):
            die(f"--xid-gpu {args.xid_gpu}: {args.preset} has GPUs 0-{len(uuids) - 1}")
        front = front_program()
        with (
            nvidia(bin_dir, env, work / "nvidia") as theirs_running,
            nodeagent(env, work / "nodeagent", front) as ours_running,
            nodeagent(env, work / "nodeagent-python", None) as python_running,
            floor_server(work / "floor", floor_answer(ours_running)) as floor,
        ):
            (theirs, ours), extra = measure(
                [theirs_running, ours_running], python_running, floor, control, uuids, args
            )
        cdi = cdi_times(bin_dir, env, work, args.cdi_runs)
    report(theirs, ours, extra, cdi, args)


if __name__ == "__main__":
    main()
