"""The agent's configuration file (``version: v1``), every field with its default and bounds.

Precedence: command line, then environment (``NODEAGENT_<SECTION>_<FIELD>``), then this file.
``docs/config.md`` documents every field; a test keeps the two in step.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import AfterValidator, Field, model_validator

from nodeagent.config.device_plugin import DevicePluginSection
from nodeagent.config.dra import DraSection
from nodeagent.config.errors import ConfigError, FieldError, FieldPath, Problem, dotted
from nodeagent.config.health import HealthSection
from nodeagent.config.kubernetes import KubernetesSection
from nodeagent.config.loader import Schema, deep_merge, env_overrides, validate_document
from nodeagent.config.metrics import MetricsSection
from nodeagent.config.pool_policy import PoolPolicy
from nodeagent.config.types import LabelValue, kube_node_name
from nodeagent.config.yamlfile import Document, read_document

DEFAULT_STATE_DIR = Path("/var/lib/nodeagent")
KIND = "an agent config"


# Pool names become the value of the nodeagent.io/pool label, which tiering selects on.
PoolName = LabelValue


class NodeSection(Schema):
    """Which node this is and which pool it belongs to."""

    name: Annotated[str, AfterValidator(kube_node_name)] | None = Field(
        None,
        description="Kubernetes node name (RFC 1123); falls back to env NODE_NAME, then hostname",
    )
    pool: PoolName = Field("default", description="the pool whose policy applies (see `pools`)")


class SamplerSection(Schema):
    """The sampler thread that reads NVML into one snapshot."""

    interval_s: float = Field(
        1.0,
        ge=0.05,
        le=3600,
        description="seconds between samples; health checks and metrics use this pace",
    )
    nvlink_counters_interval_s: float = Field(
        10.0, ge=0, le=3600, description="NVLink error counters are read this often"
    )
    profiling: bool = Field(
        True, description="GPM profiling figures (SM, tensor, DRAM activity) on Hopper and later"
    )
    profiling_interval_s: float = Field(
        5.0, ge=0, le=3600, description="GPM figures are sampled this often, averaged over it"
    )


class MigSection(Schema):
    """MIG reconciliation at start and on policy change."""

    enabled: bool = Field(True, description="apply the pool's mig_layout when it names one")
    layout_file: Path | None = Field(
        None, description="mig-parted v1 file; None uses the built-in standard layouts"
    )
    allow_reset: bool = Field(
        False, description="reset a GPU for a pending mode change when nothing runs on it"
    )
    force: bool = Field(
        False, description="destroy busy instances when the layout needs their slices"
    )


def _default_pools() -> dict[str, PoolPolicy]:
    return {"default": PoolPolicy()}


class AgentConfig(Schema):
    """The whole agent configuration."""

    node: NodeSection = Field(default_factory=NodeSection)
    state_dir: Path = Field(
        DEFAULT_STATE_DIR, description="health history, MIG intent, and the status file"
    )
    sampler: SamplerSection = Field(default_factory=SamplerSection)
    mig: MigSection = Field(default_factory=MigSection)
    health: HealthSection = Field(default_factory=HealthSection)
    device_plugin: DevicePluginSection = Field(default_factory=DevicePluginSection)
    dra: DraSection = Field(default_factory=DraSection)
    metrics: MetricsSection = Field(default_factory=MetricsSection)
    kubernetes: KubernetesSection = Field(default_factory=KubernetesSection)
    pools: dict[PoolName, PoolPolicy] = Field(
        default_factory=_default_pools,
        description="policy per pool name; node.pool picks this node's",
        json_schema_extra={"placeholder": "pool"},
    )

    @model_validator(mode="after")
    def _pool_exists(self) -> Self:
        if self.node.pool not in self.pools:
            known = ", ".join(sorted(self.pools)) or "none"
            found = FieldError()
            found.add(("node", "pool"), f"{self.node.pool!r} is not in pools (known: {known})")
            raise found
        return self

    @property
    def pool(self) -> PoolPolicy:
        """The policy of this node's pool."""
        return self.pools[self.node.pool]

    @property
    def node_name(self) -> str:
        """The node name: the config, else env NODE_NAME (downward API), else the hostname."""
        return resolve_node_name(self.node.name)

    def describe(self) -> str:
        """The effective config as one line of JSON (the file's keys), for the start-up log."""
        return json.dumps(self.model_dump(mode="json", by_alias=True), sort_keys=True)

    def gpu_indices(self) -> list[tuple[FieldPath, int]]:
        """Every GPU index this node's policy names, and where it is named.

        They come from this pool's ``gpu_sharing`` and NVIDIA's ``devices`` lists; UUIDs are
        not indices, and other pools describe other nodes.
        """
        out: list[tuple[FieldPath, int]] = [
            (("pools", self.node.pool, "gpu_sharing", key), int(key))
            for key in self.pool.gpu_sharing
            if key.isdigit()
        ]
        sharing = self.device_plugin.sharing
        if sharing is not None:
            out += [
                (("device_plugin", "sharing", *place), int(index))
                for place, index in sharing.gpu_indices()
            ]
        return out


def resolve_node_name(configured: str | None) -> str:
    """A configured node name, else env NODE_NAME (downward API), else the hostname."""
    return configured or os.environ.get("NODE_NAME") or os.uname().nodename


@dataclass(frozen=True, slots=True)
class HealthSettings:
    """What a one-shot health check reads of the agent config."""

    health: HealthSection
    expected_driver_version: str | None
    node_name: str


def load_health_settings(
    path: Path | None, *, environ: Mapping[str, str] | None = None
) -> HealthSettings:
    """The health section, the pool's expected driver and the node name, as
    :func:`load_agent_config` gives them.

    With no file and no ``NODEAGENT_`` override of these sections every value is a default, so
    only the health section's model is built: validating the whole config builds every
    section's schema, which takes longer than `nodeagent health` may (bench/cli_startup.py).
    Raises ConfigError.
    """
    env = os.environ if environ is None else environ
    overridden = env_overrides(AgentConfig, env)[0].keys() & {"node", "health", "pools"}
    if path is None and not overridden:
        default_pool = PoolPolicy.model_fields["expected_driver_version"].default
        return HealthSettings(HealthSection(), default_pool, resolve_node_name(None))
    cfg = load_agent_config(path, environ=env)
    return HealthSettings(cfg.health, cfg.pool.expected_driver_version, cfg.node_name)


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
    doc = Document("<defaults>", {"version": "v1"}) if path is None else read_document(path)
    env_values, origins = env_overrides(AgentConfig, os.environ if environ is None else environ)
    extra = env_values
    if overrides:
        extra = deep_merge(extra, overrides)
        origins = {**origins, **{p: "command line" for p in _leaves(overrides)}}
    return validate_document(AgentConfig, doc, kind=KIND, extra=extra, origins=origins)


def _leaves(data: Mapping[str, Any], prefix: FieldPath = ()) -> list[FieldPath]:
    out: list[FieldPath] = []
    for key, value in data.items():
        if isinstance(value, Mapping):
            out += _leaves(value, (*prefix, key))
        else:
            out.append((*prefix, key))
    return out


def check_gpu_indices(config: AgentConfig, gpu_count: int, path: Path | None) -> None:
    """Refuse a config that names GPU indices this node lacks (checked once the node is open).

    Raises:
        ConfigError: one problem per index, with the line in ``path`` where it is named.
    """
    named = config.gpu_indices()
    missing = [(place, index) for place, index in named if index >= gpu_count]
    if not missing:
        return
    try:
        doc = read_document(path) if path is not None else None
    except ConfigError:
        doc = None  # changed since it was loaded: name the fields without lines
    name = str(path) if path is not None else "<defaults>"
    has = f"it has GPUs 0-{gpu_count - 1}" if gpu_count else "it has no GPU"
    raise ConfigError(
        [
            Problem(
                name,
                doc.line(place) if doc is not None else None,
                dotted(place),
                f"no GPU {index} on this node ({has})",
            )
            for place, index in missing
        ]
    )
