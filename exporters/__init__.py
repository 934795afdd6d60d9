"""The Prometheus exporter: snapshot rendering, the metrics HTTP server and pod attribution.

:func:`nodeagent_exporters.component.build` makes the agent's ``metrics`` component; the
package itself imports nothing, so ``python -m nodeagent_exporters.catalog`` (the docs
generator) stays light.
"""
