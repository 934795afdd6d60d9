"""Fixtures: a device plugin manager on a simulated node, talking to a test kubelet."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nodeagent.config.schema import AgentConfig, load_agent_config
from nodeagent.gpu.node import GpuNode
from nodeagent.gpu.types import NodeSnapshot
from nodeagent.testing import mps_control
from nodeagent.testing.health import ScriptedHealth
from nodeagent.testing.kubelet import TestKubelet
from nodeagent.testing.nodes import enable_mig
from nodeagent_device_plugin.manager import PluginManager


def make_config(data: Mapping[str, Any] | None = None) -> AgentConfig:
    """An AgentConfig from a dict shaped like the YAML file (no env, no file)."""
    return load_agent_config(None, environ={}, overrides=dict(data or {}))


@dataclass
class Plugin:
    """A running plugin manager and its test kubelet."""

    manager: PluginManager
    kubelet: TestKubelet
    node: GpuNode
    health: ScriptedHealth
    directory: Path
    snapshot: NodeSnapshot

    def uuid(self, index: int) -> str:
        return self.snapshot.gpus[index].info.uuid


@pytest.fixture
def mps_binary(short_dir: Path) -> Path:
    """An executable stand-in for nvidia-cuda-mps-control."""
    return mps_control.install(short_dir)


@pytest.fixture(params=["agent", "front"])
def run_plugin(
    request: pytest.FixtureRequest, make_node: Callable[..., GpuNode], short_dir: Path
) -> Iterator[Callable[..., Plugin]]:
    """Factory: ``run_plugin("dgx-h100", config={...}, mig={0: ["3g.40gb"]})``.

    Every test runs twice: with the agent answering Allocate, and with the Allocate front
    (device_plugin/front) on the kubelet's sockets, as the container image runs it.
    """
    front = request.getfixturevalue("front_program") if request.param == "front" else None
    running: list[tuple[Plugin, threading.Event, threading.Thread]] = []

    def start(
        preset: str,
        config: Mapping[str, Any] | None = None,
        mig: Mapping[int, list[str]] | None = None,
        start_kubelet: bool = True,
    ) -> Plugin:
        node = make_node(preset)
        if mig:
            enable_mig(node, mig)
        data: dict[str, Any] = {"device_plugin": {"mps": {"root": str(short_dir / "mps")}}}
        for key, value in (config or {}).items():
            if key == "device_plugin":
                data["device_plugin"].update(value)
            else:
                data[key] = value
        if front is not None:
            data["device_plugin"].setdefault("allocate_front", str(front))
        cfg = make_config(data)
        kubelet = TestKubelet(short_dir / "kubelet")
        if start_kubelet:
            kubelet.start()
        health = ScriptedHealth()
        manager = PluginManager(short_dir / "kubelet", cfg.device_plugin, cfg.pool, health)
        snapshot = node.snapshot()
        manager.start(snapshot)
        stop = threading.Event()
        thread = threading.Thread(target=manager.run, args=(stop,), daemon=True)
        thread.start()
        plugin = Plugin(manager, kubelet, node, health, short_dir / "kubelet", snapshot)
        running.append((plugin, stop, thread))
        return plugin

    yield start
    for plugin, stop, thread in running:
        stop.set()
        thread.join(5)
        plugin.manager.shutdown()
        plugin.kubelet.stop()
