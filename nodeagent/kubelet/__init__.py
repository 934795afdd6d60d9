"""Kubelet APIs: device plugin v1beta1, pod-resources v1, plugin registration, DRA v1/v1beta1
and DRA resource health v1alpha1 (generated stubs)."""
