"""The capability labels this node publishes, from the latest snapshot and the agent's state."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from nodeagent import labels
from nodeagent.agent.component import AgentContext
from nodeagent.agent.mig_reconciler import MigReconciler


def capability_provider(
    ctx: AgentContext, reconciler: MigReconciler | None
) -> Callable[[], Mapping[str, str]]:
    """A callable giving the node's capability labels (GFD names plus ``nodeagent.io/``).

    Health labels are left out: the health reporter owns ``gpu-health``, ``stability`` and the
    driver version. The MIG layout label appears once the reconciler applied the pool's layout.
    """

    def provide() -> Mapping[str, str]:
        snapshot = ctx.snapshots.latest
        if snapshot is None:
            return {}
        facts = labels.NodeFacts(
            pool=ctx.config.node.pool, mig_strategy=str(ctx.config.device_plugin.mig_strategy)
        )
        result = labels.capability_labels(snapshot, facts)
        layout = reconciler.applied_layout if reconciler is not None else None
        if layout is not None:
            result[labels.MIG_LAYOUT] = labels.label_value(layout)
        return result

    return provide
