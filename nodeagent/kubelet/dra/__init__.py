"""Kubelet DRA plugin API (generated stubs)."""
