"""The Prometheus exporter: snapshot rendering, the metrics HTTP server and pod attribution.

``build_component(ctx)`` is the agent's factory for the ``metrics`` component.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nodeagent.agent.component import AgentContext, Component


def build_component(ctx: AgentContext) -> Component | None:
    """The metrics component, or None when ``metrics.enabled`` is false.

    Imported lazily so ``python -m nodeagent_exporters.catalog`` (the docs generator) stays light.
    """
    from nodeagent_exporters.component import build_component as build

    return build(ctx)


__all__ = ["build_component"]
