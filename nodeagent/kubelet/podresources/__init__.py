"""Kubelet pod-resources API."""
