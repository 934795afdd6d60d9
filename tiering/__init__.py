"""The central tiering service: node tiers from capabilities, safe drains of unstable nodes.

Agents publish capability labels and health (``nodeagent.labels``); this service reads them from
the API server, writes ``nodeagent.io/tier`` on every node, and takes unstable nodes out of
service within a disruption budget. See ``docs/tiering.md``.
"""
