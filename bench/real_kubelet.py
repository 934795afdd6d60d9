"""The real kubelet beside the test kubelets: the same four paths, p50 and p99, in one run.

    python bench/real_kubelet.py [--reps 20] [--poll-ms 10]

Real side: a control plane (kube-apiserver, kube-scheduler, kube-controller-manager) and one
:class:`~nodeagent.testing.kube.realnode.RealNode` (kubelet v1.37 + fakecri + ``nodeagent run
--simulate dgx-h100``). Test side: the same plugins on the same simulated dgx-h100, driven by
``nodeagent/testing/kubelet.py`` (device plugin) and ``nodeagent/testing/drakubelet.py`` (DRA),
in this process. Every measure is taken ``--reps`` times on each side.

What each row measures (real side / test side):

1. **pod -> Allocate -> container request.** Real: the pod is created in the API server ->
   kube-scheduler binds it -> the kubelet admits it (device manager: GetPreferredAllocation and
   Allocate on nodeagent's socket) -> fakecri records its CreateContainer request. Test: the
   test kubelet's GetPreferredAllocation + Allocate for one GPU, call to response (it has no
   API server, scheduler or runtime: that is all it offers of the path).
2. **kubelet restart -> plugin registered.** Real: the stopped kubelet is started again (its
   process start) -> its log shows nodeagent's new Register for ``nvidia.com/gpu`` (the
   agent saw the socket directory wiped and registered again). Test: ``TestKubelet.restart``
   (sockets deleted, registration server back) -> the plugin's Register arrives.
3. **XID 79 -> allocatable lowered.** Real: ``SimControl.inject("xid", gpu, code=79)`` on the
   agent's simulated node -> the Node's ``status.allocatable["nvidia.com/gpu"]`` in the API
   server reads 7 (agent health model -> device plugin ListAndWatch -> kubelet device manager ->
   node status). Test: the same injection -> the real health model -> the plugin's ListAndWatch
   shows the GPU Unhealthy at the test kubelet (the kubelet and API server legs do not exist).
4. **DRA claim allocated -> NodePrepareResources done -> container request**, for a claim on a
   full GPU and on a dynamic MIG device (3g.40gb, created on prepare). Real: kube-scheduler
   writes the claim's ``status.allocation`` (seen in the API) -> the agent logs ``prepared
   claim`` (the end of NodePrepareResources in the plugin) -> fakecri records the
   CreateContainer request; two rows, allocated -> prepared and allocated -> container request.
   Test: the test DRA kubelet's NodePrepareResources call -> response for an already-allocated
   claim (the whole of what it offers; shown in the "prepared" row, and "-" in the other).
   The first real claim after the agent restarted with a new DRA config is one more, untimed
   in the p50/p99 rows and shown on a row of its own (it can wait on the kubelet's connection
   to the freshly registered plugin).

Timestamps: the bench polls (API objects through a pooled client, the agent log, fakecri's
request file) every ``--poll-ms`` (10 ms by default); the resolution of a real-side number is
that interval plus one poll's cost (printed with the table). Test-side numbers are call to
answer or condition-variable wake-ups: sub-millisecond resolution. p99 over few repetitions is
the largest sample.

Needs the programs of ``make kube-bins`` and root (the kubelet runs in a private mount
namespace). Everything is written in one temporary directory; every process it starts is
stopped on exit, Ctrl-C included.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, __file__.rsplit("/", 1)[0])
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from device_plugin_common import running, table

from nodeagent.agent.backend import open_node
from nodeagent.config.health import HealthSection
from nodeagent.health.model import HealthModel
from nodeagent.sim.control import SimControl
from nodeagent.testing.drakubelet import TestDraKubelet
from nodeagent.testing.events import pumping_events
from nodeagent.testing.kube.controlplane import ControlPlane, ControlPlaneError, bins_dir
from nodeagent.testing.kube.deploy import install_identities
from nodeagent.testing.kube.realnode import RealNode, can_make_namespaces, node_bins_dir
from tests.dra.plugin_support import Claims, claim_json, make_driver, serve

GPU = "nvidia.com/gpu"
GPU_SOCKET = "nodeagent-gpu.sock"
DRIVER = "gpu.nodeagent.io"
REPO = Path(__file__).resolve().parents[1]
DRA_OVERLAY = REPO / "deploy" / "kubernetes" / "overlays" / "dra"
DRA_FEATURE_GATES = {"DRAPartitionableDevices": True, "DRADeviceTaints": True}
MIG_SELECTOR = "device.attributes['gpu.nodeagent.io'].profile == '3g.40gb'"

Samples = dict[str, list[float]]


class Poll:
    """Polls conditions every ``interval_s``; records when each first held (monotonic s)."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.costs: list[float] = []  # how long one round of checks took

    def first_times(
        self, checks: dict[str, Callable[[], bool]], *, what: str, timeout_s: float = 60.0
    ) -> dict[str, float]:
        seen: dict[str, float] = {}
        deadline = time.monotonic() + timeout_s
        while len(seen) < len(checks):
            start = time.monotonic()
            for name, check in checks.items():
                if name not in seen and check():
                    seen[name] = time.monotonic()
            self.costs.append(time.monotonic() - start)
            if time.monotonic() > deadline:
                missing = ", ".join(n for n in checks if n not in seen)
                raise TimeoutError(f"{what}: no {missing} within {timeout_s:.0f}s")
            if len(seen) < len(checks):
                time.sleep(self.interval_s)
        return seen


class FileWatch:
    """The text appended to a file since the watch began (its size then)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0

    def text(self) -> str:
        if not self.path.exists():
            return ""
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        # Only whole lines: a writer may be half-way through the last one.
        return data[: data.rfind(b"\n") + 1].decode(errors="replace")

    def contains(self, needle: str) -> bool:
        return needle in self.text()


def _quantiles(samples: Sequence[float]) -> tuple[float, float]:
    """(p50, p99) in ms of samples in seconds; p99 is the nearest rank."""
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, max(0, round(0.99 * len(ordered)) - 1))]
    return statistics.median(ordered) * 1e3, p99 * 1e3


# --- the real kubelet ------------------------------------------------------------------------


def _allocatable(node: RealNode) -> int:
    status = node.core.read_node(node.name).status
    found = (status.allocatable if status is not None else None) or {}
    return int(found.get(GPU, "-1"))


def _scheduled(node: RealNode, namespace: str, pod: str) -> Callable[[], bool]:
    def check() -> bool:
        spec = node.core.read_namespaced_pod(pod, namespace).spec
        return spec is not None and bool(spec.node_name)

    return check


def _more_registrations(node: RealNode, before: int) -> Callable[[], bool]:
    return lambda: node.registrations(GPU) > before


def _logged(watch: FileWatch, needle: str) -> Callable[[], bool]:
    return lambda: watch.contains(needle)


def _request_for(watch: FileWatch, namespace: str, pod: str) -> Callable[[], bool]:
    """Whether fakecri has recorded a CreateContainer for the pod since the watch began."""

    def check() -> bool:
        for line in watch.text().splitlines():
            meta = json.loads(line).get("sandbox_config", {}).get("metadata", {})
            if meta.get("namespace") == namespace and meta.get("name") == pod:
                return True
        return False

    return check


def real_allocate(node: RealNode, poll: Poll, namespace: str, reps: int) -> Samples:
    out: Samples = {"scheduled": [], "container request": []}
    for i in range(reps):
        name = f"alloc-{i}"
        requests = FileWatch(node.requests_path)
        start = time.monotonic()
        node.core.create_namespaced_pod(namespace, node.pod(name, {GPU: "1"}))  # type: ignore[arg-type]
        seen = poll.first_times(
            {
                "scheduled": _scheduled(node, namespace, name),
                "container request": _request_for(requests, namespace, name),
            },
            what=f"kubelet on {node.name}: pod {namespace}/{name}",
        )
        for key, at in seen.items():
            out[key].append(at - start)
        node.delete_pod(namespace, name)
    return out


def real_restart(node: RealNode, poll: Poll, reps: int) -> list[float]:
    out: list[float] = []
    for _ in range(reps):
        before = node.registrations(GPU)
        node.stop_kubelet()
        log = FileWatch(node.kubelet.log_path)
        start = time.monotonic()
        node.kubelet.start()
        seen = poll.first_times(
            {"registered": _more_registrations(node, before)},
            what=f"kubelet on {node.name}: registration of {GPU} after a restart",
        )
        out.append(seen["registered"] - start)
        # As RealNode.start_kubelet: a pod admitted before the first sync from the API server
        # may fail, so the next measure starts once the kubelet has synced and holds 8 GPUs.
        poll.first_times(
            {"synced": _logged(log, '"SyncLoop ADD" source="api"')},
            what=f"kubelet on {node.name}: sync after a restart",
        )
        node.wait_devices(GPU, 8)
        node.wait_allocatable(GPU, 8)
    return out


def real_xid(node: RealNode, poll: Poll, reps: int) -> list[float]:
    assert node.agent is not None
    control = SimControl(node.agent.sim_state)
    out: list[float] = []
    for i in range(reps):
        gpu = i % 8
        node.wait_allocatable(GPU, 8, timeout_s=60)
        start = time.monotonic()
        control.inject("xid", gpu, code=79)
        seen = poll.first_times(
            {"lowered": lambda: _allocatable(node) == 7},
            what=f"kubelet on {node.name}: allocatable {GPU} 7 after XID 79 on GPU {gpu}",
        )
        out.append(seen["lowered"] - start)
        control.clear(gpu)
    node.wait_allocatable(GPU, 8, timeout_s=60)
    return out


def _claim(name: str, mig: bool) -> dict[str, Any]:
    request: dict[str, Any] = {"deviceClassName": "mig.nodeagent.io" if mig else DRIVER}
    if mig:
        request["selectors"] = [{"cel": {"expression": MIG_SELECTOR}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "dev", "exactly": request}]}},
    }


def real_dra(
    node: RealNode, plane: ControlPlane, poll: Poll, namespace: str, reps: int, mig: bool
) -> Samples:
    from kubernetes import client

    custom = client.CustomObjectsApi(plane.api_client())
    agent_log = FileWatch(node.workdir / "agent" / "agent.log")
    claims = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
    out: Samples = {"prepared": [], "container request": [], "first": []}
    kind = "mig" if mig else "gpu"

    def allocated(claim: str) -> Callable[[], bool]:
        def check() -> bool:
            got: dict[str, Any] = custom.get_namespaced_custom_object(  # type: ignore[assignment]
                "resource.k8s.io", "v1", namespace, "resourceclaims", claim
            )
            return bool(got.get("status", {}).get("allocation"))

        return check

    # Repetition 0 is the first claim after the agent (re)started with this DRA config: it is
    # reported on its own row ("first"), as it waits on the kubelet's plugin connection.
    for i in range(reps + 1):
        claim, pod = f"{kind}-claim-{i}", f"{kind}-pod-{i}"
        plane.request("POST", claims, _claim(claim, mig))
        manifest = node.pod(pod)
        manifest["spec"]["resourceClaims"] = [{"name": "dev", "resourceClaimName": claim}]
        manifest["spec"]["containers"][0]["resources"] = {"claims": [{"name": "dev"}]}
        requests = FileWatch(node.requests_path)
        node.core.create_namespaced_pod(namespace, manifest)  # type: ignore[arg-type]
        seen = poll.first_times(
            {
                "allocated": allocated(claim),
                "prepared": _logged(agent_log, f"prepared claim {namespace}/{claim}:"),
                "container request": _request_for(requests, namespace, pod),
            },
            what=f"kubelet on {node.name}: pod {namespace}/{pod} with claim {claim}",
            timeout_s=90,
        )
        if i == 0:
            out["first"].append(seen["container request"] - seen["allocated"])
        else:
            for key in ("prepared", "container request"):
                out[key].append(seen[key] - seen["allocated"])
        node.delete_pod(namespace, pod)
        plane.request("DELETE", f"{claims}/{claim}")
        poll.first_times(
            {"unprepared": _logged(agent_log, f"unprepared claim {namespace}/{claim}")},
            what=f"agent on {node.name}: unprepare of claim {claim}",
        )
    return out


def real_side(root: Path, reps: int, poll: Poll, log: Callable[[str], None]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with ControlPlane(
        scheduler=True,
        controller_manager=True,
        feature_gates=DRA_FEATURE_GATES,
        workdir=root / "plane",
    ) as plane:
        identities = install_identities(plane)
        node = RealNode(
            plane,
            "bench-node",
            agent_kubeconfig=identities.agent.kubeconfig,
            workdir=root / "node",
            # Recovery after a second, not after the production hold times (as the tests).
            agent_config={
                "device_plugin": {"health_recovery_quiet_s": 1.0},
                "health": {"recovery_quiet_s": 1.0, "fatal_hold_s": 1.0},
            },
        )
        with node:
            namespace = f"bench-{uuid.uuid4().hex[:5]}"
            plane.create_namespace(namespace)
            node.wait_devices(GPU, 8)
            node.wait_allocatable(GPU, 8)
            log("real: pod -> Allocate -> container request")
            results["allocate"] = real_allocate(node, poll, namespace, reps)
            log("real: XID 79 -> allocatable")
            results["xid"] = real_xid(node, poll, reps)
            log("real: kubelet restart -> registration")
            results["restart"] = real_restart(node, poll, reps)
            log("real: DRA, full GPU")
            plane.apply(DRA_OVERLAY / "rbac.yaml")
            plane.apply(DRA_OVERLAY / "deviceclasses.yaml")
            node.reconfigure_agent({"dra": {"enabled": True}, "device_plugin": {"enabled": False}})
            results["dra gpu"] = real_dra(node, plane, poll, namespace, reps, mig=False)
            log("real: DRA, dynamic MIG")
            node.sim("mig", "apply", "-c", "all-enabled", "--yes", "--allow-reset")
            node.reconfigure_agent({"pools": {"default": {"dra": {"dynamic_mig": True}}}})
            results["dra mig"] = real_dra(node, plane, poll, namespace, reps, mig=True)
    return results


# --- the test kubelets -----------------------------------------------------------------------


def test_allocate(reps: int) -> list[float]:
    out: list[float] = []
    with running("dgx-h100") as bench:
        free = list(bench.kubelet.wait_devices(GPU, lambda d: len(d) == 8, 10.0))
        bench.kubelet.allocate(GPU, bench.kubelet.preferred(GPU, free, 1))  # warm the channel
        for _ in range(reps):
            start = time.monotonic()
            chosen = bench.kubelet.preferred(GPU, free, 1)
            bench.kubelet.allocate(GPU, chosen)
            out.append(time.monotonic() - start)
    return out


def _grew(items: Sequence[object], before: int) -> Callable[[], bool]:
    return lambda: len(items) > before


def test_restart(reps: int) -> list[float]:
    out: list[float] = []
    with running("dgx-h100") as bench:
        kubelet = bench.kubelet
        kubelet.wait_devices(GPU, lambda d: len(d) == 8, 10.0)
        for _ in range(reps):
            with kubelet.cond:
                before = len(kubelet.registrations)
            start = time.monotonic()
            kubelet.restart()
            assert kubelet.wait(_grew(kubelet.registrations, before), 30.0), (
                "test kubelet: no registration after its restart"
            )
            out.append(time.monotonic() - start)
    return out


class _Clock:
    """Wall time plus a jump, to pass the health model's fatal hold without waiting it out."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


def test_xid(reps: int) -> list[float]:
    clock = _Clock()
    model = HealthModel(HealthSection(fatal_hold_s=30.0, recovery_quiet_s=0.0), clock=clock)
    out: list[float] = []
    with running("dgx-h100", {"device_plugin": {"health_recovery_quiet_s": 0}}, health=model) as b:
        model.on_snapshot(b.node.snapshot())
        control = SimControl(b.state_dir)
        uuids = [g.info.uuid for g in b.node.snapshot().gpus]
        with pumping_events(b.node, model.on_event, poll_s=0.01):
            for i in range(reps):
                gpu = i % 8

                def health_is(want: str, u: str = uuids[gpu]) -> Callable[[Any], bool]:
                    return lambda devices: devices.get(u, ("",))[0] == want

                b.kubelet.wait_devices(GPU, health_is("Healthy"), 10.0)
                start = time.monotonic()
                control.inject("xid", gpu, code=79)
                b.kubelet.wait_devices(GPU, health_is("Unhealthy"), 10.0)
                out.append(time.monotonic() - start)
                control.clear(gpu)
                clock.offset += 31.0
                model.on_snapshot(b.node.snapshot())
                model.tick()
    return out


def test_dra(root: Path, reps: int) -> dict[str, list[float]]:
    from nodeagent.testing.nodes import enable_mig

    out: dict[str, list[float]] = {"dra gpu": [], "dra mig": []}
    root.mkdir(parents=True, exist_ok=True)
    node = open_node(simulate="dgx-h100", state_dir=root / "sim")
    enable_mig(node, {0: []})
    claims = Claims()
    server = serve(make_driver(node, root, claims), root)
    kubelet = TestDraKubelet(root / "plugins_registry")
    try:
        connection = kubelet.register()
        warm = claims.add(claim_json("warm-up", [("r", "gpu-3")]))  # the channel's first call
        assert connection.prepare([warm])[warm[1]].error == ""
        assert connection.unprepare([warm]) == {warm[1]: ""}
        for i in range(reps):
            for key, device in (("dra gpu", "gpu-2"), ("dra mig", "gpu-0-mig-3g40gb-9-0")):
                ref = claims.add(claim_json(f"{key.replace(' ', '-')}-{i}", [("r", device)]))
                start = time.monotonic()
                answer = connection.prepare([ref])[ref[1]]
                out[key].append(time.monotonic() - start)
                assert answer.error == "", f"test DRA kubelet: prepare of {device}: {answer.error}"
                assert connection.unprepare([ref]) == {ref[1]: ""}
    finally:
        kubelet.close()
        server.stop()
        node.close()
    return out


# --- the table -------------------------------------------------------------------------------


def _cell(samples: Sequence[float] | None) -> str:
    if not samples:
        return "-"
    p50, p99 = _quantiles(samples)
    return f"{p50:.1f} / {p99:.1f}"


def _ratio(real: Sequence[float] | None, test: Sequence[float] | None) -> str:
    if not real or not test:
        return "-"
    ratio = statistics.median(real) / statistics.median(test)
    return f"{ratio:.0f}x" if ratio >= 10 else f"{ratio:.1f}x"


def report(real: dict[str, Any], test: dict[str, Any], reps: int, poll: Poll) -> str:
    rows: list[tuple[str, Sequence[float] | None, Sequence[float] | None]] = [
        ("pod created -> scheduled", real["allocate"]["scheduled"], None),
        (
            "pod created -> Allocate -> container request (test: Preferred+Allocate)",
            real["allocate"]["container request"],
            test["allocate"],
        ),
        ("kubelet restart -> plugin registered", real["restart"], test["restart"]),
        (
            "XID 79 -> allocatable lowered (test: ListAndWatch Unhealthy)",
            real["xid"],
            test["xid"],
        ),
    ]
    for kind, label in (("gpu", "full GPU"), ("mig", "dynamic MIG 3g.40gb")):
        rows.append(
            (
                f"DRA {label}: claim allocated -> NodePrepareResources done",
                real[f"dra {kind}"]["prepared"],
                test["dra"][f"dra {kind}"],
            )
        )
        rows.append(
            (
                f"DRA {label}: claim allocated -> container request",
                real[f"dra {kind}"]["container request"],
                None,
            )
        )
        rows.append(
            (
                f"DRA {label}: first claim after the agent restarted -> container request",
                real[f"dra {kind}"]["first"],
                None,
            )
        )
    lines = [
        f"{reps} repetitions per measure; ms, p50 / p99 (p99 = nearest rank: the largest of few)",
        table(
            ["measure", "real kubelet p50 / p99", "test kubelet p50 / p99", "ratio (p50)"],
            [(name, _cell(r), _cell(t), _ratio(r, t)) for name, r, t in rows],
        ),
    ]
    if poll.costs:
        cost, worst = _quantiles(poll.costs)
        lines.append(
            f"real-side resolution: polled every {poll.interval_s * 1e3:.0f} ms "
            f"+ one round of checks (median {cost:.1f} ms, p99 {worst:.1f} ms)"
        )
    return "\n".join(lines)


@contextmanager
def _interrupt_on_term() -> Iterator[None]:
    """SIGTERM as Ctrl-C, so the same cleanup runs (every process stopped, temp dir gone)."""

    def handler(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--reps", type=int, default=20, help="repetitions per measure (20)")
    parser.add_argument("--poll-ms", type=float, default=10.0, help="polling interval (10)")
    args = parser.parse_args()
    if args.reps < 1 or args.poll_ms <= 0:
        print("real_kubelet: --reps must be >= 1 and --poll-ms > 0", file=sys.stderr)
        return 2
    try:
        bins_dir(kueue=False)
        node_bins_dir()
    except ControlPlaneError as exc:
        hint = "" if "make kube-bins" in str(exc) else " (run make kube-bins)"
        print(f"real_kubelet: {exc}{hint}", file=sys.stderr)
        return 2
    why = can_make_namespaces()
    if why is not None:
        print(f"real_kubelet: the kubelet needs a private mount namespace: {why}", file=sys.stderr)
        return 2
    started = time.monotonic()
    # The test side's plugins log each fault they see; the table is what this prints.
    logging.basicConfig(level=logging.ERROR)

    def log(text: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {text}", file=sys.stderr, flush=True)

    poll = Poll(args.poll_ms / 1e3)
    with _interrupt_on_term(), tempfile.TemporaryDirectory(prefix="bench-real-kubelet-") as tmp:
        root = Path(tmp)
        try:
            log("test kubelets")
            test: dict[str, Any] = {
                "allocate": test_allocate(args.reps),
                "restart": test_restart(args.reps),
                "xid": test_xid(args.reps),
                "dra": test_dra(root / "test-dra", args.reps),
            }
            log("real kubelet: control plane and node")
            real = real_side(root, args.reps, poll, log)
        except KeyboardInterrupt:
            print("real_kubelet: interrupted; every process stopped", file=sys.stderr)
            return 130
        except (ControlPlaneError, TimeoutError, AssertionError) as exc:
            print(f"real_kubelet: {exc}", file=sys.stderr)
            return 1
    log("done")
    print(f"machine: {os.cpu_count()} cores; simulated dgx-h100; kubelet v1.37 + fakecri")
    print(report(real, test, args.reps, poll))
    return 0


if __name__ == "__main__":
    sys.exit(main())
