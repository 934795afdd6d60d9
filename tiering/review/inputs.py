"""What the pool review reads from the API server, read once (the command, the tests and the
benchmark use the one reader)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nodeagent_tiering.cluster import JSON, kueue
from nodeagent_tiering.cluster.cluster_api import Kube


@dataclass
class ReviewInputs:
    """Everything the section reads, as the API server returns it (raw objects)."""

    now_s: float
    period_s: float
    nodes: Sequence[JSON]
    pods: Sequence[JSON] = ()
    events: Sequence[JSON] = ()
    kueue: kueue.KueueApi | None = None
    flavors: Sequence[JSON] = ()
    cluster_queues: Sequence[JSON] = ()
    local_queues: Sequence[JSON] = ()
    workloads: Sequence[JSON] = ()


def read_inputs(kube: Kube, *, now_s: float, period_s: float) -> ReviewInputs:
    """Read the cluster for the review (the one reader: the command and the tests use it).

    Raises:
        KubeError: a list failed.
    """
    api = kube.kueue_api()
    # With Kueue the waits come from the Workloads and only ended pods matter (failures); a
    # large cluster's running pods, most of them not GPU pods at all, are not read.
    ended = "status.phase!=Running,status.phase!=Pending" if api is not None else None
    inputs = ReviewInputs(
        now_s=now_s,
        period_s=period_s,
        nodes=kube.list_nodes().get("items") or [],
        pods=kube.list_all_pods(ended),
        events=kube.list_all_events(),
        kueue=api,
    )
    if api is not None:
        inputs.flavors = kube.list_kueue(api, kueue.RESOURCE_FLAVOR)
        inputs.cluster_queues = kube.list_kueue(api, kueue.CLUSTER_QUEUE)
        inputs.local_queues = kube.list_kueue(api, kueue.LOCAL_QUEUE)
        inputs.workloads = kube.list_kueue(api, kueue.WORKLOAD)
    return inputs
