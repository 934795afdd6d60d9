"""What the test suite and the benchmarks share, shipped with the package (as ``kopf.testing``).

A fake clock, a polling helper, simulated-node shaping, a scripted health source, a test kubelet
for the device plugin and the pod-resources API, an independent reference for preferred
allocations, and a real Kubernetes control plane on loopback (:mod:`nodeagent.testing.kube`).
All but the control plane import from a plain install; the control plane needs the ``testing``
extra (certificates, its pytest plugin).
Product code never imports this package (the import-linter contract says so).
"""
