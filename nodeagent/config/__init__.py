"""Versioned (``version: v1``) file formats: one schema mechanism, one error type."""

from nodeagent.config.errors import ConfigError, Problem

__all__ = ["ConfigError", "Problem"]
