"""Kubelet APIs: device plugin v1beta1 and pod-resources v1 (generated stubs)."""
