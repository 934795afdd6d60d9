"""Shared test support: the Kubernetes API stand-in."""
