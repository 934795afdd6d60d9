"""Kubelet plugin registration API (generated stubs)."""
