"""What the test suite and the benchmarks share, shipped with the package (as ``kopf.testing``).

A fake clock, a polling helper, simulated-node shaping, a scripted health source, a test kubelet
for the device plugin and the pod-resources API, and an independent reference for preferred
allocations. Product code never imports this package (the import-linter contract says so).
"""
