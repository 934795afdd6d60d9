"""A real Kubernetes control plane for tests, benchmarks and people (``make cluster``).

:mod:`.controlplane` runs the pinned programs on loopback, :mod:`.nodes` stands in for kubelets,
:mod:`.pytest_plugin` gives the test suite its fixtures.
"""
