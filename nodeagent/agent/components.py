"""The seam where features plug into the agent: one factory per component, in start order.

Producers come before consumers: the sampler publishes snapshots, health subscribes to them and
sets ``ctx.health``, then the device plugin and the exporter read both. A factory returns None
when its feature is turned off in the config.
"""

from __future__ import annotations

from collections.abc import Callable

import nodeagent_exporters
from nodeagent.agent import mig_reconciler
from nodeagent.agent.component import AgentContext, Component
from nodeagent.agent.mig_reconciler import MigReconciler
from nodeagent.agent.node_labels import capability_provider
from nodeagent.agent.sampler import Sampler
from nodeagent.health import component as health_component
from nodeagent_device_plugin import component as device_plugin_component

ComponentFactory = Callable[[AgentContext], Component | None]


def _sampler(ctx: AgentContext) -> Component:
    return Sampler(ctx.node, ctx.snapshots, ctx.config.sampler)


FACTORIES: list[ComponentFactory] = [
    _sampler,
    mig_reconciler.build_component,
    health_component.build_component,
    device_plugin_component.build_component,
    nodeagent_exporters.build_component,
]


def build_components(ctx: AgentContext) -> list[Component]:
    """Instantiate every enabled component, in order."""
    components = []
    for factory in FACTORIES:
        component = factory(ctx)
        if component is not None:
            components.append(component)
    reconciler = next((c for c in components if isinstance(c, MigReconciler)), None)
    ctx.node_labels = capability_provider(ctx, reconciler)
    return components
