"""The pod index against the real API server: this node's pods, by UID and container ID."""

from __future__ import annotations

from kubernetes import client

from nodeagent.kube.pods import PodIndexPoller, container_id
from nodeagent.testing.kube.controlplane import ControlPlane
from nodeagent.testing.kube.nodes import create_node, pod_manifest
from nodeagent.testing.waiting import wait_until

CID = "f" * 64


def test_lists_only_this_nodes_pods_with_their_container_ids(
    control_plane: ControlPlane, kube_ns: str
) -> None:
    api = control_plane.api_client()
    core = client.CoreV1Api(api)
    here, there = f"{kube_ns}-gpu", f"{kube_ns}-other"
    for node in (here, there):
        create_node(api, node, gpus=8)
    try:
        mine = core.create_namespaced_pod(kube_ns, pod_manifest("mine", node_name=here))
        core.create_namespaced_pod(kube_ns, pod_manifest("theirs", node_name=there))
        # What a kubelet reports once the container runs: its runtime ID.
        patched = core.patch_namespaced_pod_status(
            "mine",
            kube_ns,
            {
                "status": {
                    "phase": "Running",
                    "containerStatuses": [
                        {
                            "name": "main",
                            "image": "registry.invalid/workload:1",
                            "imageID": "",
                            "ready": True,
                            "restartCount": 0,
                            "containerID": f"containerd://{CID}",
                            "state": {"running": {}},
                        }
                    ],
                }
            },
        )
        assert [cs.container_id for cs in patched.status.container_statuses or []] == [
            f"containerd://{CID}"
        ]
        poller = PodIndexPoller(core, here, 1.0)
        # The agent lists again every interval; a list answered from the API server's watch
        # cache may trail the status patch (twice in full runs the CID was missing, once for
        # 10 s), so the wait is long and a miss says what the list and the pod held.
        found = wait_until(lambda: CID in getattr(poller.poll(), "containers", {}), timeout_s=30)
        assert found, (
            f"{poller.polls} lists of node {here}, the last one failed: {poller.failing}; "
            f"last index: {poller.latest}; the pod's container statuses now: "
            f"{core.read_namespaced_pod_status('mine', kube_ns).status.container_statuses}"
        )
        index = poller.latest
        assert index is not None
        mine_pods = {uid: ref for uid, ref in index.pods.items() if ref[0] == kube_ns}
        assert mine_pods == {mine.metadata.uid: (kube_ns, "mine")}
        assert index.containers[CID] == (mine.metadata.uid, "main")

        # The API server away: the last index stays.
        poller.api = client.CoreV1Api(
            client.ApiClient(client.Configuration(host="http://127.0.0.1:9"))
        )
        assert poller.poll() is index
    finally:
        for node in (here, there):
            core.delete_node(node)


def test_container_id_strips_the_runtime_scheme() -> None:
    assert container_id(f"cri-o://{CID}") == CID
    assert container_id(f"docker://{CID}") == CID
    assert container_id("") is None
    assert container_id(None) is None
