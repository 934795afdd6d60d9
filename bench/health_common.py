"""Shared setup for the health benchmarks: a simulated agent (sampler + health) and a stand-in
API server on loopback, all in this process, the way ``nodeagent run --simulate`` composes them.
"""

from __future__ import annotations

import statistics
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

from nodeagent.agent.component import AgentContext
from nodeagent.agent.sampler import Sampler
from nodeagent.config.health import HealthSection
from nodeagent.config.kubernetes import KubernetesSection
from nodeagent.config.schema import AgentConfig, NodeSection
from nodeagent.gpu.node import GpuNode, open_node
from nodeagent.health.component import HealthComponent, build_component
from nodeagent.health.model import HealthModel
from tests.support.kubeapi import KubeAPIServer, make_node

NODE = "bench-node"
PRESET = "dgx-h100"


@dataclass
class Agent:
    """The running pieces."""

    node: GpuNode
    ctx: AgentContext
    model: HealthModel
    component: HealthComponent
    api: KubeAPIServer
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=10)
        self.api.stop()
        self.node.close()


def start_agent(tmp: Path, health: HealthSection, sample_interval_s: float = 1.0) -> Agent:
    """Sampler and health component on threads, flagging a stand-in API server."""
    api = KubeAPIServer().start()
    api.put("nodes", make_node(NODE, {"kubernetes.io/hostname": NODE}, gpu_healthy=None))
    node = open_node(simulate=PRESET, state_dir=tmp / "sim")
    cfg = AgentConfig(
        node=NodeSection(name=NODE),
        state_dir=tmp / "agent",
        health=health,
        kubernetes=KubernetesSection(enabled=True, api_server=api.url),
    )
    ctx = AgentContext(cfg, node, cfg.state_dir)
    component = build_component(ctx)
    assert component is not None
    assert isinstance(ctx.health, HealthModel)
    agent = Agent(node, ctx, ctx.health, component, api)
    sampler = Sampler(node, ctx.snapshots, sample_interval_s)
    for target in (sampler.run, component.run):
        t = threading.Thread(target=target, args=(agent.stop,), daemon=True)
        t.start()
        agent.threads.append(t)
    if not api.wait_for(lambda s: condition_status(s) is not None, timeout_s=10):
        raise SystemExit("the agent never patched the stand-in API server")
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
