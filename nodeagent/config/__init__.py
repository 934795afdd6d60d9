"""Versioned (``version: v1``) configuration: schemas, loading and validation."""

from nodeagent.config.loader import ConfigError, load_dataclass, parse_dataclass

__all__ = ["ConfigError", "load_dataclass", "parse_dataclass"]
