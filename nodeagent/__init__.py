"""nodeagent: node-level GPU sharing and health agent."""

from __future__ import annotations

__version__ = "0.1.0"
