"""pytest fixtures for the real control plane: one per test session, a namespace per test.

- ``control_plane``: etcd, kube-apiserver, kube-scheduler, kube-controller-manager and Kueue,
  started on first use and stopped when the session ends (also on Ctrl-C or a failure).
  Without the programs the test skips, naming ``make kube-bins``; with ``CI=true`` it fails.
- ``private_control_plane``: etcd and kube-apiserver only, a second one for the session, for
  tests that must see every object of the cluster (a review of all nodes and their Events) or
  need the API server configured otherwise: its watch cache is off for nodes, so a node watch
  from before an etcd compaction ends with ``410 Gone`` at once. Tests on it clean up after
  themselves.
- ``kube_ns``: a fresh namespace for the test, deleted afterwards.
- ``kubelets``: the kubelet stand-in for nodes without kubelets (runs bound pods, finishes
  deletions), shared by the session.
- ``kube_identities``: the deploy manifests' ServiceAccounts and RBAC applied (once), with a
  kubeconfig for the agent's and the tiering service's account.
- ``kube_nodes``: a :class:`NodeSet` for the test (nodes named after its namespace, deleted
  afterwards).
- ``real_node``: a node run by a real kubelet with nodeagent on it
  (:class:`~nodeagent.testing.kube.realnode.RealNode`), shared by the session; a test using it
  that fails keeps the kubelet's, the runtime's and the agent's logs. ``host_snapshot``: what
  the machine looked like before that node started (``/bin``, the kernel settings the kubelet
  guards, the checkout, ``/etc/kueue``), to compare after.

Every test that uses ``control_plane`` is marked ``kube`` (``pytest -m kube`` runs them). When
such a test fails, the components' logs are copied next to the test's temporary directory and
the path is printed at the end of the run.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nodeagent.testing.kube.controlplane import ControlPlane, ControlPlaneError, bins_dir
from nodeagent.testing.kube.deploy import Identities, install_identities
from nodeagent.testing.kube.nodes import KubeletStandIn, NodeSet
from nodeagent.testing.kube.realnode import (
    KERNEL_DEFAULTS,
    RealNode,
    can_make_namespaces,
    node_bins_dir,
)

# The DRA gates the DRA driver's tests need on kube-apiserver and kube-scheduler.
DRA_FEATURE_GATES = {"DRAPartitionableDevices": True, "DRADeviceTaints": True}
_KEPT_LOGS = pytest.StashKey[list[str]]()
_REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kube: runs against the real Kubernetes control plane")
    config.stash[_KEPT_LOGS] = []


_PLANES = ("control_plane", "private_control_plane")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(plane in getattr(item, "fixturenames", ()) for plane in _PLANES):
            item.add_marker(pytest.mark.kube)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    report = yield
    item.stash.setdefault(_REPORTS, {})[report.when] = report
    return report


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    kept = config.stash.get(_KEPT_LOGS, [])
    if kept:
        terminalreporter.section("control plane logs of failed tests")
        for line in kept:
            terminalreporter.write_line(line)


def _missing(reason: str) -> None:
    """Skip naming what is missing; fail instead with ``CI=true``."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def _bins() -> Path:
    """The programs, or a skip naming ``make kube-bins`` (a failure with ``CI=true``)."""
    try:
        return bins_dir()
    except ControlPlaneError as exc:
        _missing(str(exc))
        raise  # unreachable: _missing raises


_REPO = Path(__file__).resolve().parents[3]


def snapshot_host() -> dict[str, Any]:
    """What a real kubelet must leave as it is: the names in ``/bin`` (a kubelet run from ``/``
    deleted it), the kernel settings it guards, the checkout's top-level names and whether
    ``/etc/kueue`` exists (Kueue's metrics certificate once went there)."""
    sysctl: dict[str, str | None] = {}
    for entry in KERNEL_DEFAULTS:
        try:
            sysctl[entry] = (Path("/proc/sys") / entry).read_text().strip()
        except OSError:
            sysctl[entry] = None
    return {
        "/bin": sorted(p.name for p in Path("/bin").iterdir()),
        "/proc/sys": sysctl,
        "checkout": sorted(p.name for p in _REPO.iterdir()),
        "/etc/kueue": Path("/etc/kueue").exists(),
    }


@pytest.fixture(scope="session")
def host_snapshot() -> dict[str, Any]:
    """The machine before any real kubelet of the session started."""
    return snapshot_host()


def real_node_fixture(
    control_plane: ControlPlane,
    kube_identities: Identities,
    host_snapshot: dict[str, Any],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RealNode]:
    """A real-kubelet node with nodeagent on it, on the control plane; stopped and its Node
    deleted on exit. Registered as a fixture below, and by tests/real_kubelet/ for its package."""
    try:
        bins = node_bins_dir()
    except ControlPlaneError as exc:
        _missing(str(exc))
        raise
    why = can_make_namespaces()
    if why is not None:
        _missing(f"a real kubelet needs a private mount namespace: {why}")
    node = RealNode(
        control_plane,
        "real-node-0",
        agent_kubeconfig=kube_identities.agent.kubeconfig,
        bins=bins,
        # A recovered GPU comes back after a second, not after the production hold times.
        agent_config={
            "device_plugin": {"health_recovery_quiet_s": 1.0},
            "health": {"recovery_quiet_s": 1.0, "fatal_hold_s": 1.0},
        },
    )
    with node:
        yield node


# The whole session's by default. tests/real_kubelet/ narrows it to its own package, so the node
# (its kubelet, its agent and its Node object) is gone before other packages' tests list nodes.
_real_node_session = pytest.fixture(scope="session", name="_real_node_session")(real_node_fixture)


@pytest.fixture
def real_node(
    _real_node_session: RealNode, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[RealNode]:
    """The session's real-kubelet node; its logs are kept when the test fails."""
    request.node.add_marker(pytest.mark.kubelet)
    yield _real_node_session
    reports = request.node.stash.get(_REPORTS, {})
    if any(r.failed for r in reports.values()):
        kept = _real_node_session.keep_logs(tmp_path / "real-node-logs")
        request.config.stash[_KEPT_LOGS].append(f"{request.node.nodeid}: {kept}")


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """The session's control plane (see the module docstring)."""
    with ControlPlane(
        scheduler=True,
        controller_manager=True,
        kueue=True,
        bins=_bins(),
        # DRA (resource.k8s.io/v1) is GA; partitionable devices (beta, on by default since 1.36)
        # and device taints (GA in 1.37) are named so the DRA tests never rest on defaults.
        feature_gates=DRA_FEATURE_GATES,
    ) as plane:
        yield plane


@pytest.fixture(scope="session")
def private_control_plane() -> Iterator[ControlPlane]:
    """A second, bare control plane (see the module docstring)."""
    with ControlPlane(bins=_bins(), apiserver_args=["--watch-cache-sizes=nodes#0"]) as plane:
        yield plane


@pytest.fixture(scope="session")
def kubelets(control_plane: ControlPlane) -> Iterator[KubeletStandIn]:
    """The kubelet stand-in, running for the rest of the session."""
    stand_in = KubeletStandIn(control_plane.api_client()).start()
    stand_in.synced.wait(30)
    yield stand_in
    stand_in.stop()


@pytest.fixture
def kube_ns(
    control_plane: ControlPlane, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[str]:
    """A namespace of this test's own (named after it), deleted afterwards; on failure the
    control plane's logs are kept."""
    stem = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{stem}-{uuid.uuid4().hex[:5]}"
    control_plane.create_namespace(name)
    yield name
    control_plane.delete_namespace(name)
    reports = request.node.stash.get(_REPORTS, {})
    if any(r.failed for r in reports.values()):
        kept = control_plane.keep_logs(tmp_path / "control-plane-logs")
        request.config.stash[_KEPT_LOGS].append(f"{request.node.nodeid}: {kept}")


@pytest.fixture(scope="session")
def kube_identities(control_plane: ControlPlane) -> Identities:
    """The components' ServiceAccounts, bound by the shipped RBAC manifests."""
    return install_identities(control_plane)


@pytest.fixture
def kube_nodes(control_plane: ControlPlane, kube_ns: str) -> Iterator[NodeSet]:
    """Nodes of this test (named ``<namespace>-<suffix>``), deleted afterwards."""
    nodes = NodeSet(control_plane.api_client(), kube_ns)
    yield nodes
    nodes.delete_all()
