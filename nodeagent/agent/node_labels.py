"""The capability labels this node publishes, from the latest snapshot and the agent's state."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from nodeagent import labels
from nodeagent.config.schema import AgentConfig
from nodeagent.runtime.snapshots import SnapshotFeed


class LayoutSource(Protocol):
    """Which MIG layout the node holds in full (the MIG reconciler)."""

    @property
    def applied_layout(self) -> str | None:
        """The layout name last applied in full, or None."""
        ...


class CapabilityLabels:
    """The node's capability labels (GFD names plus ``nodeagent.io/``), computed when asked.

    Health labels are left out: the health reporter owns ``gpu-health``, ``stability`` and the
    driver version. The MIG layout label appears once the reconciler applied the pool's layout
    (``mig`` says which; without a reconciler there is no such label).
    """

    def __init__(
        self, snapshots: SnapshotFeed, config: AgentConfig, mig: LayoutSource | None = None
    ) -> None:
        self._snapshots = snapshots
        self._config = config
        self._mig = mig

    def reload(self, config: AgentConfig) -> None:
        """Take the new pool and MIG strategy (SIGHUP)."""
        self._config = config

    def __call__(self) -> Mapping[str, str]:
        """The labels now; empty before the first snapshot."""
        snapshot = self._snapshots.latest
        if snapshot is None:
            return {}
        config = self._config
        facts = labels.NodeFacts(
            pool=config.node.pool, mig_strategy=str(config.device_plugin.mig_strategy)
        )
        result = labels.capability_labels(snapshot, facts)
        layout = self._mig.applied_layout if self._mig is not None else None
        if layout is not None:
            result[labels.MIG_LAYOUT] = labels.label_value(layout)
        return result
