"""Small clusters for the diagnosis tests: API-shaped nodes and pods with published GPU state.

A node is described by its GPUs; a MIG GPU by its instances as ``"1g.10gb@6*"`` (profile,
start slice, ``*`` when busy: a running pod holds it). The builders also create the running
pods that hold what is busy, so the scheduler's arithmetic (allocatable minus requests) and the
published state agree, as they do on a real node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

from nodeagent import labels as lbl
from nodeagent.agent.backend import open_node
from nodeagent.agent.mig_planning import plan_for_diagnosis
from nodeagent.gpu.types import MigGeometry
from nodeagent.published import PublishedGpu, PublishedInstance, PublishedNode, encode
from nodeagent.testing.kube.nodes import pod_manifest
from nodeagent_tiering.cluster.view import ClusterView, view_from_objects
from nodeagent_tiering.pending.diagnosis import diagnose as diagnose_with
from nodeagent_tiering.pending.results import PassResult, Settings

JSON = dict[str, Any]
H100 = "dgx-h100"
A30 = "a30x4"


@cache
def geometry(preset: str, root: str = "/tmp") -> MigGeometry:
    """The real MIG geometry of a preset's GPU model, read through the GPU layer."""
    import tempfile

    with tempfile.TemporaryDirectory(dir=root) as d, open_node(preset, Path(d)) as node:
        found = node.mig_geometry(0)
    assert found is not None
    return found


def diagnose(view: ClusterView, settings: Settings | None = None) -> PassResult:
    """The pass with the planner ``mig apply`` uses, as the service runs it."""
    return diagnose_with(view, plan_for_diagnosis, settings)


def size_of(geo: MigGeometry, profile: str) -> int:
    p = geo.profile(profile)
    assert p is not None, profile
    return p.placements[0].size


def mig_resource(profile: str) -> str:
    return f"nvidia.com/mig-{profile.replace('+', '.')}"


def pod(
    name: str,
    request: Mapping[str, int],
    *,
    namespace: str = "team",
    node: str | None = None,
    selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping[str, str]] = (),
    labels: Mapping[str, str] | None = None,
    gates: Sequence[str] = (),
    unschedulable: str | None = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
    uid: str | None = None,
) -> JSON:
    """A Pod: running on ``node``, else pending (Unschedulable with ``unschedulable``)."""
    manifest = pod_manifest(
        name,
        resources={k: str(v) for k, v in request.items()},
        node_name=node,
        labels=labels,
        node_selector=selector,
        tolerations=tolerations,
    )
    manifest["metadata"].update(namespace=namespace, uid=uid or f"uid-{namespace}-{name}")
    if gates:
        manifest["spec"]["schedulingGates"] = [{"name": g} for g in gates]
    status: JSON = {"phase": "Running" if node else "Pending"}
    if not node and not gates and unschedulable is not None:
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": unschedulable,
            }
        ]
    return {**manifest, "status": status}


@dataclass
class Cluster:
    """Nodes and pods under construction."""

    nodes: list[JSON] = field(default_factory=list)
    pods: list[JSON] = field(default_factory=list)
    workloads: list[JSON] | None = None
    _n: int = 0

    def _running(self, node: str, request: Mapping[str, int], name: str | None = None) -> str:
        self._n += 1
        name = name or f"run-{self._n}"
        self.pods.append(pod(name, request, node=node, namespace="busy"))
        return f"busy/{name}"

    def whole(
        self,
        name: str,
        *,
        gpus: int = 8,
        used: Sequence[int] = (),
        tier: str = "training",
        islands: Sequence[int] | None = None,
        taints: Sequence[Mapping[str, str]] = (),
        unschedulable: bool = False,
        published: bool = True,
        holders_known: bool = True,
        at: Sequence[Sequence[int]] | None = None,
        names: Sequence[str] | None = None,
    ) -> Cluster:
        """A whole-GPU node; ``used``: one running pod per entry, holding that many GPUs
        (lowest indices first, or the indices in ``at``); ``islands``: NVLink island of each
        GPU (default: one)."""
        holders: dict[int, str] = {}
        index = 0
        for n, units in enumerate(used):
            key = self._running(name, {"nvidia.com/gpu": units}, names[n] if names else None)
            for k in range(units):
                holders[at[n][k] if at else index] = key
                index += 1
        gpu_list = tuple(
            PublishedGpu(
                index=i,
                model="NVIDIA H100 80GB HBM3",
                island=(islands[i] if islands else 0),
                numa=0 if i < gpus // 2 else 1,
                busy=i in holders,
                holder=holders.get(i) if holders_known else None,
            )
            for i in range(gpus)
        )
        state = PublishedNode(gpu_list, {}, holders_known)
        self._add(name, tier, {"nvidia.com/gpu": gpus}, state if published else None, taints,
                  unschedulable)  # fmt: skip
        return self

    def mig(
        self,
        name: str,
        layouts: Sequence[Sequence[str]],
        *,
        preset: str = H100,
        tier: str = "shared",
        taints: Sequence[Mapping[str, str]] = (),
        unschedulable: bool = False,
    ) -> Cluster:
        """A MIG node: per GPU its instances ``"profile@start"``, ``*`` suffix = busy."""
        geo = geometry(preset)
        allocatable: dict[str, int] = {}
        gpu_list = []
        for i, layout in enumerate(layouts):
            instances = []
            for text in layout:
                busy = text.endswith("*")
                profile, start = text.rstrip("*").split("@")
                resource = mig_resource(profile)
                allocatable[resource] = allocatable.get(resource, 0) + 1
                if busy:
                    self._running(name, {resource: 1})
                instances.append(
                    PublishedInstance(profile, int(start), size_of(geo, profile), busy, busy)
                )
            gpu_list.append(
                PublishedGpu(index=i, model=geo.model, mig=tuple(instances), island=0, numa=0)
            )
        state = PublishedNode(tuple(gpu_list), {geo.model: geo}, True)
        self._add(name, tier, allocatable, state, taints, unschedulable)
        return self

    def _add(
        self,
        name: str,
        tier: str,
        allocatable: Mapping[str, int],
        state: PublishedNode | None,
        taints: Sequence[Mapping[str, str]],
        unschedulable: bool,
    ) -> None:
        annotations = {lbl.GPU_STATE_ANNOTATION: encode(state)} if state is not None else {}
        spec: JSON = {"taints": [dict(t) for t in taints]} if taints else {}
        if unschedulable:
            spec["unschedulable"] = True
        self.nodes.append(
            {
                "metadata": {
                    "name": name,
                    "labels": {lbl.TIER: tier, "kubernetes.io/hostname": name},
                    "annotations": annotations,
                },
                "spec": spec,
                "status": {"allocatable": {k: str(v) for k, v in allocatable.items()}},
            }
        )

    def pending(self, name: str, request: Mapping[str, int], **kwargs: Any) -> Cluster:
        """Add a pending pod (namespace ``team``)."""
        self.pods.append(pod(name, request, **kwargs))
        return self

    def view(self) -> ClusterView:
        """The view the diagnosis reads."""
        return view_from_objects(self.nodes, self.pods, self.workloads)


NOON = datetime(2026, 12, 1, 12, tzinfo=UTC).timestamp()  # a fixed "now" for history tests


def fragmented() -> Cluster:
    """Team "busy" runs 3-GPU pods on both nodes: 5 + 5 free, a pending 8-GPU pod waits."""
    c = Cluster().whole("a", used=[3]).whole("b", used=[3])
    return c.pending("big", {"nvidia.com/gpu": 8}, namespace="research")
