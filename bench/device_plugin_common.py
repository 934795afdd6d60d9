"""Shared setup for the device plugin benchmarks: a simulated node, the plugin, a test kubelet."""

from __future__ import annotations

import statistics
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodeagent.agent.backend import open_node
from nodeagent.config.schema import AgentConfig, load_agent_config
from nodeagent.gpu.node import GpuNode
from nodeagent.testing.health import ScriptedHealth
from nodeagent.testing.kubelet import TestKubelet
from nodeagent.testing.nodes import enable_mig
from nodeagent_device_plugin.manager import PluginManager


@dataclass
class Bench:
    """A running plugin with its kubelet, on a fresh simulated node."""

    node: GpuNode
    manager: PluginManager
    kubelet: TestKubelet
    health: Any
    state_dir: Path


def config(data: Mapping[str, Any] | None = None) -> AgentConfig:
    """An agent config from a YAML-shaped dict."""
    return load_agent_config(None, environ={}, overrides=dict(data or {}))


@contextmanager
def running(
    preset: str,
    data: Mapping[str, Any] | None = None,
    mig: Mapping[int, list[str]] | None = None,
    health: Any = None,
) -> Iterator[Bench]:
    """Start node, kubelet and plugin; stop everything on exit."""
    root = Path(tempfile.mkdtemp(prefix="dpb-"))
    node = open_node(simulate=preset, state_dir=root / "sim")
    if mig:
        enable_mig(node, mig)
    cfg = config(data)
    kubelet = TestKubelet(root / "k")
    kubelet.start()
    source = health if health is not None else ScriptedHealth()
    manager = PluginManager(root / "k", cfg.device_plugin, cfg.pool, source)
    manager.start(node.snapshot())
    stop = threading.Event()
    thread = threading.Thread(target=manager.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield Bench(node, manager, kubelet, source, root / "sim")
    finally:
        stop.set()
        thread.join(5)
        manager.shutdown()
        kubelet.stop()
        node.close()


def quantiles_ms(samples: Sequence[float]) -> tuple[float, float]:
    """(median, p99) in milliseconds of samples in seconds."""
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return statistics.median(ordered) * 1000, p99 * 1000


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
