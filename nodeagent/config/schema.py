"""The agent's configuration file (``version: v1``), every field with its default.

Precedence: command line, then environment (``NODEAGENT_<SECTION>_<FIELD>``), then this file.
``docs/config.md`` documents every field; a test keeps the two in step.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodeagent.config.device_plugin import DevicePluginSection
from nodeagent.config.health import HealthSection
from nodeagent.config.kubernetes import KubernetesSection
from nodeagent.config.loader import (
    ConfigError,
    deep_merge,
    env_overrides,
    parse_dataclass,
    read_yaml,
)
from nodeagent.config.metrics import MetricsSection
from nodeagent.config.policy import PoolPolicy

DEFAULT_STATE_DIR = Path("/var/lib/nodeagent")


@dataclass(frozen=True, slots=True)
class NodeSection:
    """Which node this is and which pool it belongs to."""

    name: str | None = None  # Kubernetes node name; falls back to env NODE_NAME, then hostname
    pool: str = "default"  # the pool whose policy applies (see `pools`)


@dataclass(frozen=True, slots=True)
class SamplerSection:
    """The sampler thread that reads NVML into one snapshot."""

    interval_s: float = 1.0  # seconds between samples; health checks and metrics use this pace
    nvlink_counters_interval_s: float = 10.0  # NVLink error counters are read this often

    def __post_init__(self) -> None:
        if not 0.05 <= self.interval_s <= 3600:
            raise ValueError(f"interval_s must be between 0.05 and 3600, got {self.interval_s}")
        if not 0 <= self.nvlink_counters_interval_s <= 3600:
            raise ValueError(
                "nvlink_counters_interval_s must be between 0 and 3600, "
                f"got {self.nvlink_counters_interval_s}"
            )


@dataclass(frozen=True, slots=True)
class MigSection:
    """MIG reconciliation at start and on policy change."""

    enabled: bool = True  # apply the pool's mig_layout when it names one
    layout_file: Path | None = None  # mig-parted v1 file; None uses the built-in standard layouts
    allow_reset: bool = False  # reset a GPU for a pending mode change when nothing runs on it
    force: bool = False  # destroy busy instances when the layout needs their slices


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """The whole agent configuration."""

    node: NodeSection = field(default_factory=NodeSection)
    state_dir: Path = DEFAULT_STATE_DIR  # health history, MIG intent, and the status file
    sampler: SamplerSection = field(default_factory=SamplerSection)
    mig: MigSection = field(default_factory=MigSection)
    health: HealthSection = field(default_factory=HealthSection)
    device_plugin: DevicePluginSection = field(default_factory=DevicePluginSection)
    metrics: MetricsSection = field(default_factory=MetricsSection)
    kubernetes: KubernetesSection = field(default_factory=KubernetesSection)
    pools: dict[str, PoolPolicy] = field(
        default_factory=lambda: {"default": PoolPolicy()}, metadata={"placeholder": "pool"}
    )  # policy per pool name; node.pool picks this node's

    def __post_init__(self) -> None:
        if self.node.pool not in self.pools:
            known = ", ".join(sorted(self.pools)) or "none"
            raise ValueError(f"node.pool {self.node.pool!r} is not in pools (known: {known})")

    @property
    def pool(self) -> PoolPolicy:
        """The policy of this node's pool."""
        return self.pools[self.node.pool]

    @property
    def node_name(self) -> str:
        """The node name: the config, else env NODE_NAME (downward API), else the hostname."""
        return self.node.name or os.environ.get("NODE_NAME") or os.uname().nodename


def load_agent_config(
    path: Path | None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> AgentConfig:
    """Load the agent config: file, then env overrides, then command-line overrides.

    With no file every field takes its documented default. Raises ConfigError naming the file,
    line and field of every problem.
    """
    data: Any = {"version": "v1"}
    lines: dict[tuple[str, ...], int] = {}
    source = "<defaults>"
    if path is not None:
        data, lines = read_yaml(path)
        source = str(path)
        if data is None:
            raise ConfigError(f"{path}: the file is empty; start it with `version: v1`")
    env = os.environ if environ is None else environ
    merged = deep_merge(data, env_overrides(AgentConfig, env))
    if overrides:
        merged = deep_merge(merged, overrides)
    return parse_dataclass(AgentConfig, merged, source=source, lines=lines)
