"""Shared setup for the health benchmarks: a simulated agent (sampler + health, optionally the
device plugin with a test kubelet) composed the way ``nodeagent run --simulate`` does, flagging a
stand-in API server on loopback: in this process, or one already running elsewhere (``api_url``).
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

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
    from nodeagent.testing.kubelet import TestKubelet
    from nodeagent_device_plugin.component import DevicePluginComponent
    from tests.support.kubeapi import KubeAPIServer

REPO = Path(__file__).parents[1]
NODE = "bench-node"
PRESET = "dgx-h100"
RESOURCE = "nvidia.com/gpu"  # what the device plugin advertises for whole GPUs (MIG off)


@dataclass
class Agent:
    """The running pieces."""

    node: GpuNode
    snapshots: SnapshotStore
    model: HealthModel
    component: HealthComponent
    api: KubeAPIServer | None  # None when the stand-in runs in another process
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
        if self.api is not None:
            self.api.stop()
        self.node.close()


def start_agent(
    tmp: Path,
    health: HealthSection,
    sample_interval_s: float = 1.0,
    *,
    api_url: str | None = None,
    node_name: str = NODE,
    device_plugin: bool = False,
) -> Agent:
    """Sampler and health component on threads, flagging a stand-in API server.

    Without ``api_url`` the stand-in runs in this process (``Agent.api``); with it, the node
    ``node_name`` must already exist there. ``device_plugin`` adds the real device plugin
    component, registered with a test kubelet in ``tmp`` (devices recover without a quiet period,
    so benchmark rounds can repeat on the same GPU).
    """
    api = None
    if api_url is None:
        from tests.support.kubeapi import KubeAPIServer, make_node

        api = KubeAPIServer().start()
        api.put("nodes", make_node(node_name, {"kubernetes.io/hostname": node_name},
                                   gpu_healthy=None))  # fmt: skip
        api_url = api.url
    kubelet = None
    plugin = DevicePluginSection(enabled=False)
    if device_plugin:
        from nodeagent.testing.kubelet import TestKubelet

        kubelet = TestKubelet(tmp / "kubelet")
        kubelet.start()
        plugin = DevicePluginSection(kubelet_dir=kubelet.directory, health_recovery_quiet_s=0.0)
    node = open_node(simulate=PRESET, state_dir=tmp / "sim")
    cfg = AgentConfig(
        node=NodeSection(name=node_name),
        state_dir=tmp / "agent",
        health=health,
        kubernetes=KubernetesSection(enabled=True, api_server=api_url),
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
    agent = Agent(node, snapshots, model, component, api, kubelet, dp)
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
            raise SystemExit("the agent never patched the stand-in API server")
        time.sleep(0.02)
    if kubelet is not None and not kubelet.wait(lambda: RESOURCE in kubelet.plugins, 10):
        agent.close()
        raise SystemExit("the device plugin never registered with the test kubelet")
    return agent


def condition_status(api: KubeAPIServer) -> str | None:
    """The bench node's ``GPUHealthy`` status, ``None`` before the agent set it."""
    cond = api.node_condition(NODE, "GPUHealthy")
    return None if cond is None else str(cond["status"])


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
