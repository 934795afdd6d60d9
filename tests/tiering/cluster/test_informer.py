"""The service's node informer on the real API server: a watch that etcd's compaction expired
is answered by a fresh list, and an API server restart by a watch resumed where it stopped
(or one list, when the restarted server no longer holds that point)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from nodeagent import labels as lbl
from nodeagent.testing.kube.controlplane import ControlPlane
from nodeagent.testing.kube.deploy import install_identities
from nodeagent.testing.kube.nodes import NodeSet
from nodeagent.testing.waiting import wait_until
from nodeagent_tiering.cluster.cluster_api import Kube, api_client
from nodeagent_tiering.cluster.informer import NodeCache
from tests.tiering.conftest import gpu_labels

# Short watches, so a stopped informer's thread ends within seconds (the service's are 300 s).
WATCH_S = 2


@pytest.fixture
def informer() -> Iterator[Callable[[NodeCache], None]]:
    """``informer(cache)`` runs the cache's list-and-watch loop until the test ends."""
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def run(cache: NodeCache) -> None:
        thread = threading.Thread(target=cache.run, args=(stop,), daemon=True)
        thread.start()
        threads.append(thread)

    yield run
    stop.set()
    for thread in threads:
        thread.join(10)
    assert not any(t.is_alive() for t in threads), "an informer did not stop"


def labelled(cache: NodeCache, name: str, value: str) -> bool:
    node = cache.get(name)
    return node is not None and node["metadata"]["labels"].get(lbl.STABILITY) == value


def test_a_watch_expired_by_compaction_lists_again(private_control_plane: ControlPlane, informer):
    plane = private_control_plane
    identity = install_identities(plane).tiering
    nodes = NodeSet(plane.api_client(), "expiry")
    try:
        nodes.create("a", gpu_labels())
        cache = NodeCache(
            Kube(api_client(kubeconfig=identity.kubeconfig.path)), watch_timeout_s=WATCH_S
        )
        cache.relist()  # what the service knew before it lost track, say, while stopped
        nodes.create("b", gpu_labels())
        nodes.patch("a", {"metadata": {"labels": {lbl.STABILITY: "unstable"}}})
        plane.compact_etcd()  # the history after that list is gone
        mark = plane.audit_mark()
        informer(cache)
        assert wait_until(
            lambda: (
                cache.get(nodes.name("b")) is not None
                and labelled(cache, nodes.name("a"), "unstable")
            ),
            timeout_s=10,
        ), "the informer never caught up after the compaction"

        def asked() -> list[tuple[str, int]]:
            return [(r.verb, r.code) for r in plane.audited(mark, user=identity.user)]

        # The API server reports the expiry inside the watch's 200 stream (an ERROR event with
        # code 410), not as the response's status; the informer answers with a fresh list and
        # watches from there.
        assert wait_until(lambda: len(asked()) >= 3, timeout_s=10), asked()
        assert asked()[:3] == [("watch", 200), ("list", 200), ("watch", 200)]
    finally:
        nodes.delete_all()


def test_an_api_server_restart_resumes_the_watch(
    control_plane: ControlPlane, kube_identities, kube_nodes: NodeSet, informer
):
    kube_nodes.create("a", gpu_labels())
    kube = Kube(api_client(kubeconfig=kube_identities.tiering.kubeconfig.path))
    cache = NodeCache(kube, watch_timeout_s=WATCH_S)
    informer(cache)
    name = kube_nodes.name("a")
    assert wait_until(lambda: labelled(cache, name, "stable"), timeout_s=10)
    mark = control_plane.audit_mark()
    control_plane.stop_apiserver()
    control_plane.start_apiserver()
    kube_nodes.patch("a", {"metadata": {"labels": {lbl.STABILITY: "unstable"}}})
    assert wait_until(lambda: labelled(cache, name, "unstable"), timeout_s=40), (
        "the informer never saw the change made after the restart"
    )
    asked = [
        (r.verb, r.code) for r in control_plane.audited(mark, user=kube_identities.tiering.user)
    ]
    # Retries while it comes up (a starting API server may refuse with 403 until its RBAC
    # caches are filled), then a watch from the last resourceVersion. The restarted server's
    # watch cache starts at etcd's current revision: when other writes moved it past the
    # informer's resourceVersion, the watch expires (410 inside its stream) and the informer
    # lists once, as client-go's do. Never more than that one list.
    assert ("watch", 200) in asked
    assert [verb for verb, _ in asked if verb != "watch"] in ([], ["list"])
