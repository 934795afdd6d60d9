"""A real Kubernetes control plane for tests, benchmarks and people (``make cluster``).

:mod:`.controlplane` runs the pinned programs on loopback, :mod:`.nodes` stands in for kubelets,
:mod:`.realnode` runs real kubelets (with a fake CRI runtime) and the agent beside them,
:mod:`.deploy` applies the shipped manifests and gives each component its ServiceAccount,
:mod:`.processes` runs the agent and the tiering service as the processes users run,
:mod:`.waiting` waits on objects by watching them, :mod:`.audit` reads what nodeagent asked the
API server, :mod:`.bulk` creates many objects fast, :mod:`.pytest_plugin` gives the test suite
its fixtures.
"""
