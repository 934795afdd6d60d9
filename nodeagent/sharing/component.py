"""The sharing feature as the agent composes it: the policy loop, or a component that idles."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from nodeagent.config.schema import AgentConfig
from nodeagent.runtime.component import Component, Idle, Reloadable
from nodeagent.runtime.snapshots import SnapshotFeed
from nodeagent.sharing.actions import SharingActions
from nodeagent.workloads import SharedDevice


class SharedSource(Protocol):
    """Where the shared GPUs of the last observed snapshot are read (the exporter's renderer)."""

    @property
    def shared(self) -> Sequence[SharedDevice]:
        """The devices several workloads use, with their interference."""
        ...


def build(
    config: AgentConfig,
    snapshots: SnapshotFeed,
    plugin: Reloadable | None,
    *,
    measured: SharedSource | None,
) -> Component:
    """The sharing actions of ``config``'s pool, acting through ``plugin``'s reload; idle when
    the pool turns them off or nothing measures interference (``measured`` is None: metrics
    are off). Turning them on takes a restart, as every feature does."""
    if not config.pool.sharing_actions.enabled or measured is None:
        return Idle(SharingActions.name)
    return SharingActions(config, snapshots, lambda: measured.shared, plugin)
