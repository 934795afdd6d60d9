"""Shared setup for the health benchmarks: a simulated agent (sampler + health, optionally the
device plugin with a test kubelet) composed the way ``nodeagent run --simulate`` does, flagging
its node on a real kube-apiserver (etcd and kube-apiserver from ``make kube-bins`` on loopback)
under the deploy manifests' ServiceAccount for the agent.

:func:`local_cluster` runs the control plane from this process (its programs are child
processes; the harness objects live here), :func:`cluster_process` runs it from a separate
``python -m nodeagent.testing.kube`` so that not even the harness's imports count in this
process's memory.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).parents[1]))

from nodeagent.agent.backend import open_node
from nodeagent.agent.sampler import Sampler
from nodeagent.config.device_plugin import DevicePluginSection
from nodeagent.config.health import HealthSection
from nodeagent.config.kubernetes import KubernetesSection
from nodeagent.config.schema import AgentConfig, NodeSection, SamplerSection
from nodeagent.gpu.node import GpuNode
from nodeagent.health import component as health_component
from nodeagent.health.component import HealthComponent
from nodeagent.health.model import HealthModel
from nodeagent.runtime.snapshots import SnapshotStore

if TYPE_CHECKING:  # imported where used, so the storm benchmark's RSS carries no gRPC
    from nodeagent.testing.kube.controlplane import ControlPlane
    from nodeagent.testing.kubelet import TestKubelet
    from nodeagent_device_plugin.component import DevicePluginComponent

REPO = Path(__file__).parents[1]
NODE = "bench-node"
PRESET = "dgx-h100"
RESOURCE = "nvidia.com/gpu"  # what the device plugin advertises for whole GPUs (MIG off)


@dataclass
class Cluster:
    """Where the agent reports: its kubeconfig, the admin's, and its node's name."""

    agent_kubeconfig: Path
    admin_kubeconfig: Path
    node: str
    agent_user: str = "system:serviceaccount:nodeagent:nodeagent"  # in the audit log
    plane: ControlPlane | None = None  # when it runs from this process
    process: subprocess.Popen[str] | None = None  # when it runs from another

    def admin_api(self) -> Any:
        """A CoreV1Api as the admin (to read the node)."""
        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(self.admin_kubeconfig), client_configuration=configuration
        )
        return client.CoreV1Api(client.ApiClient(configuration))

    def close(self) -> None:
        if self.plane is not None:
            self.plane.stop()
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=30)


def local_cluster() -> Cluster:
    """etcd and kube-apiserver started from this process, the agent's RBAC applied, a node."""
    from nodeagent.testing.kube.controlplane import ControlPlane
    from nodeagent.testing.kube.deploy import install_identities
    from nodeagent.testing.kube.nodes import create_node

    plane = ControlPlane()
    plane.start()
    try:
        identities = install_identities(plane)
        create_node(plane.api_client(), NODE, gpus=8)
    except BaseException:
        plane.stop()
        raise
    agent = identities.agent
    return Cluster(agent.kubeconfig.path, plane.admin.path, NODE, agent.user, plane=plane)


def cluster_process() -> Cluster:
    """The same from ``python -m nodeagent.testing.kube`` (scheduler and controller manager
    included there), so nothing of the harness is in this process."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "nodeagent.testing.kube", "--no-kueue", "--nodes", "1",
         "--identities"],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    seen: dict[str, str] = {}
    for line in proc.stdout:
        key, _, value = line.strip().partition(": ")
        seen[key] = value
        if line.startswith("export KUBECONFIG="):
            seen["admin"] = line.strip().split("=", 1)[1]
        if line.startswith("serving"):
            break
    else:
        proc.wait()
        raise SystemExit(f"the control plane did not start (exit {proc.returncode})")
    return Cluster(Path(seen["agent kubeconfig"]), Path(seen["admin"]), "gpu-node-0", process=proc)


@dataclass
class Agent:
    """The running pieces."""

    node: GpuNode
    snapshots: SnapshotStore
    model: HealthModel
    component: HealthComponent
    cluster: Cluster
    kubelet: TestKubelet | None = None
    device_plugin: DevicePluginComponent | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    @property
    def patches_sent(self) -> int:
        """Node and status PATCHes the agent's reporter has sent."""
        patcher = self.component.reporter.patcher
        return 0 if patcher is None else patcher.patches_sent

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=10)
        if self.kubelet is not None:
            self.kubelet.stop()
        self.node.close()


def start_agent(
    tmp: Path,
    health: HealthSection,
    cluster: Cluster,
    sample_interval_s: float = 1.0,
    *,
    device_plugin: bool = False,
) -> Agent:
    """Sampler and health component on threads, flagging ``cluster``'s node.

    ``device_plugin`` adds the real device plugin component, registered with a test kubelet in
    ``tmp`` (devices recover without a quiet period, so benchmark rounds can repeat on the same
    GPU).
    """
    kubelet = None
    plugin = DevicePluginSection(enabled=False)
    if device_plugin:
        from nodeagent.testing.kubelet import TestKubelet

        kubelet = TestKubelet(tmp / "kubelet")
        kubelet.start()
        plugin = DevicePluginSection(kubelet_dir=kubelet.directory, health_recovery_quiet_s=0.0)
    node = open_node(simulate=PRESET, state_dir=tmp / "sim")
    cfg = AgentConfig(
        node=NodeSection(name=cluster.node),
        state_dir=tmp / "agent",
        health=health,
        kubernetes=KubernetesSection(enabled=True, kubeconfig=cluster.agent_kubeconfig),
        device_plugin=plugin,
    )
    snapshots = SnapshotStore()
    model = health_component.build_model(cfg)  # the device plugin follows this model
    assert isinstance(model, HealthModel)
    component = health_component.build(cfg, model, node, snapshots)
    dp = None
    if device_plugin:
        from nodeagent_device_plugin.component import build as build_device_plugin

        dp = build_device_plugin(cfg, snapshots, model)
    agent = Agent(node, snapshots, model, component, cluster, kubelet, dp)
    sampler = Sampler(node, snapshots, SamplerSection(interval_s=sample_interval_s))
    targets = [sampler.run, component.run] + ([dp.run] if dp is not None else [])
    for target in targets:
        t = threading.Thread(target=target, args=(agent.stop,), daemon=True)
        t.start()
        agent.threads.append(t)
    deadline = time.monotonic() + 10
    while agent.patches_sent == 0:
        if time.monotonic() > deadline:
            agent.close()
            raise SystemExit("the agent never patched its node through kube-apiserver")
        time.sleep(0.02)
    if kubelet is not None and not kubelet.wait(lambda: RESOURCE in kubelet.plugins, 10):
        agent.close()
        raise SystemExit("the device plugin never registered with the test kubelet")
    return agent


def condition_status(cluster: Cluster, core: Any) -> str | None:
    """The node's ``GPUHealthy`` status as kube-apiserver has it, ``None`` before the agent set
    it (``core``: :meth:`Cluster.admin_api`)."""
    node = core.read_node(cluster.node)
    for cond in node.status.conditions or []:
        if cond.type == "GPUHealthy":
            return str(cond.status)
    return None


def p99(values: list[float]) -> float:
    """The 99th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(0.99 * len(ordered)) - 1))]


def row(name: str, values_s: list[float]) -> list[str]:
    """A table row in milliseconds: name, n, median, p99, max."""
    ms = [v * 1000 for v in values_s]
    return [name, str(len(ms)), f"{statistics.median(ms):.1f}", f"{p99(ms):.1f}",
            f"{max(ms):.1f}"]  # fmt: skip


def print_table(headers: list[str], rows: list[list[str]]) -> None:
    """An aligned plain-text table."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
