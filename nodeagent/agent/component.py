"""What a component of the agent is, and the context components share."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from nodeagent.agent.snapshots import SnapshotStore
from nodeagent.config.schema import AgentConfig
from nodeagent.gpu.node import GpuNode
from nodeagent.health.source import HealthSource


class Component(Protocol):
    """A long-running part of the agent, run on its own supervised thread.

    ``run`` blocks until ``stop`` is set and returns; raising means it crashed, and the
    supervisor restarts it with backoff. ``ready`` turns true once it serves (for READY=1 and
    ``/readyz``).
    """

    name: str

    def run(self, stop: threading.Event) -> None:
        """Do the component's work until ``stop`` is set."""
        ...

    @property
    def ready(self) -> bool:
        """Whether the component is up (serving, registered, sampled once)."""
        ...


@runtime_checkable
class Reloadable(Protocol):
    """A component that takes a new config without a restart (SIGHUP)."""

    def reload(self, config: AgentConfig) -> None:
        """Adopt ``config``; called from the main thread."""
        ...


@dataclass
class AgentContext:
    """What components share. Built once by the agent; fields set by earlier components.

    Composition order in ``nodeagent.agent.components`` makes producers (sampler, health)
    exist before consumers (device plugin, exporter).
    """

    config: AgentConfig
    node: GpuNode
    state_dir: Path
    snapshots: SnapshotStore = field(default_factory=SnapshotStore)
    health: HealthSource | None = None  # set by the health component when it is enabled
    restarts: dict[str, int] = field(default_factory=dict)  # component name -> restarts
    all_ready: Callable[[], bool] | None = None  # every component ready (set by the agent)
    alive: Callable[[], bool] | None = None  # threads up and sampling not wedged (the agent)
    # What the node should carry besides health flags: capability labels (set by the agent)
    # and capacity annotations (set by the exporter). The health reporter publishes both.
    node_labels: Callable[[], Mapping[str, str]] | None = None
    node_annotations: Callable[[], Mapping[str, str]] | None = None
    # What the device plugin serves to the kubelet now: resource name -> {device ID: healthy}
    # (replica IDs counted, as the kubelet counts them). Set by the device plugin; the exporter
    # renders advertised capacity from it, so it shows even with no kubelet to ask.
    advertised: Callable[[], Mapping[str, Mapping[str, bool]]] | None = None
