"""What the agent's parts share at run time, below every feature.

The component protocol, the snapshot store and what a feature may see of it, the health source
the device plugin and the exporter read, one exponential backoff and one subscriber list. The
wiring in :mod:`nodeagent.agent.wiring` hands these to each feature; features never import the
agent or each other.
"""
