"""Kubelet DRA resource health API, KEP-4680 (generated stubs)."""
