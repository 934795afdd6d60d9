"""Kubernetes device plugin (kubelet API v1beta1) for the node's GPUs."""
