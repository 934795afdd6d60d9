"""What the agents of a simulated cluster would publish: Node objects from a cluster file.

``nodeagent tiering simulate`` and its tests build every node of a cluster file
(:mod:`nodeagent_tiering.cluster.clusterfile`) the way its agent would describe it:

1. a simulated node of the preset in its own state directory (the simulator, through the GPU
   layer, as the agent drives it);
2. the named MIG layout applied with the real applier (:func:`nodeagent_mig.apply.reconcile`);
3. the pods the file binds to the node get devices the way the kubelet hands them out (the
   device plugin's resources, in advertisement order), with a process attached to each device,
   so their MIG instances and GPUs are busy, and the agent's pod-resources attribution says who
   holds what;
4. labels, annotations, the ``GPUHealthy`` condition and allocatable resources computed by the
   agent's own code: the capability labels, the health reporter's flags over the health model,
   the exporter's capacity annotations, the GPU-state annotation and the device plugin's
   resources (mixed MIG strategy, so every profile is its own resource).

The result is API-shaped (Node and Pod dicts), so the diagnosis reads it exactly as it reads a
real API server; a test checks that both give the same answer.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodeagent import labels as lbl
from nodeagent.agent.backend import open_node, preset_names
from nodeagent.agent.node_annotations import GpuStateAnnotation
from nodeagent.config.errors import ConfigError
from nodeagent.config.schema import AgentConfig, load_agent_config
from nodeagent.gpu.errors import GpuError
from nodeagent.gpu.node import GpuNode
from nodeagent.gpu.types import MigSlot
from nodeagent.health.model import HealthModel
from nodeagent.health.reporter import desired_flags
from nodeagent.runtime.snapshots import SnapshotStore
from nodeagent.sim.control import SimControl, SimError
from nodeagent_device_plugin.resources import ResourceError, build_resources
from nodeagent_exporters.component import MetricsExporter
from nodeagent_exporters.podresources import Allocations, PodDevice
from nodeagent_mig.apply import reconcile
from nodeagent_mig.config import DEFAULT_CONFIG_FILE, load_config
from nodeagent_tiering.cluster.clusterfile import ClusterFile, Node
from nodeagent_tiering.cluster.view import pod_requests

JSON = dict[str, Any]
CPU_CAPACITY = {"cpu": "128", "memory": "1Ti", "pods": "250", "ephemeral-storage": "1Ti"}


class SimulationError(Exception):
    """The cluster file describes something a node cannot be (one line, names the node/pod)."""


@dataclass
class SimulatedNode:
    """One node: its simulator state and what its agent publishes."""

    spec: Node
    state_dir: Path
    config: AgentConfig
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    allocatable: dict[str, int] = field(default_factory=dict)
    condition: JSON = field(default_factory=dict)
    holders: dict[str, str] = field(default_factory=dict)  # device UUID -> namespace/pod
    pids: dict[str, list[int]] = field(default_factory=dict)  # pod -> simulated processes

    @property
    def name(self) -> str:
        """The node name."""
        return self.spec.name

    def open(self) -> GpuNode:
        """The node's GPUs (close it after use)."""
        return open_node(self.spec.preset, self.state_dir)

    def manifest(self) -> JSON:
        """The Node object, status included, as the API server would return it."""
        resources = {**CPU_CAPACITY, **{k: str(v) for k, v in self.allocatable.items()}}
        spec: JSON = {}
        if self.spec.taints:
            spec["taints"] = [t.model_dump() for t in self.spec.taints]
        if self.spec.unschedulable:
            spec["unschedulable"] = True
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": dict(self.labels),
                "annotations": dict(self.annotations),
            },
            "spec": spec,
            "status": {
                "capacity": resources,
                "allocatable": resources,
                "conditions": [
                    {"type": "Ready", "status": "True", "reason": "KubeletReady"},
                    self.condition,
                ],
            },
        }


def _config(node: Node, state_dir: Path) -> AgentConfig:
    return load_agent_config(
        None,
        environ={},
        overrides={
            "node": {"name": node.name},
            "state_dir": str(state_dir / "agent"),
            "device_plugin": {"mig_strategy": "mixed"},
        },
    )


class SimulatedCluster:
    """Every node of a cluster file, simulated, with the file's pods bound where it says."""

    def __init__(self, cluster: ClusterFile, base_dir: Path, workdir: Path) -> None:
        self.cluster = cluster
        self.base_dir = base_dir
        self.nodes: dict[str, SimulatedNode] = {}
        presets = set(preset_names())
        bound: dict[str, list[JSON]] = {}
        for pod in cluster.pods:
            name = (pod.get("spec") or {}).get("nodeName")
            if name:
                bound.setdefault(name, []).append(pod)
        for node in cluster.nodes:
            if node.preset not in presets:
                raise SimulationError(
                    f"node {node.name}: unknown preset {node.preset!r} "
                    f"(presets: {', '.join(sorted(presets))})"
                )
        for name in bound:
            if name not in {n.name for n in cluster.nodes}:
                pod = bound[name][0]["metadata"]["name"]
                raise SimulationError(f"pod {pod} names spec.nodeName {name}, which is not a node")
        for node in cluster.nodes:
            state_dir = workdir / node.name
            sim = SimulatedNode(node, state_dir, _config(node, state_dir))
            self.nodes[node.name] = sim
            self._build(sim, bound.get(node.name, []))

    # building

    def _build(self, sim: SimulatedNode, pods: Sequence[JSON]) -> None:
        SimControl(sim.state_dir, sim.spec.preset).reset(sim.spec.preset)
        if sim.spec.mig is not None:
            self._apply_layout(sim)
        self._bind(sim, pods)
        self.publish(sim.name)

    def _apply_layout(self, sim: SimulatedNode) -> None:
        mig = sim.spec.mig
        assert mig is not None
        path = (self.base_dir / mig.file) if mig.file else DEFAULT_CONFIG_FILE
        try:
            cfg = load_config(path)
            with sim.open() as gpus:
                report = reconcile(
                    gpus, cfg, mig.layout, state_dir=sim.state_dir / "mig", allow_reset=True
                )
        except (ConfigError, OSError) as exc:
            raise SimulationError(f"node {sim.name}: MIG layout {mig.layout!r}: {exc}") from exc
        if not report.ok:
            problems = "; ".join(report.errors) or "not fully applied"
            raise SimulationError(f"node {sim.name}: MIG layout {mig.layout!r}: {problems}")

    def _bind(self, sim: SimulatedNode, pods: Sequence[JSON]) -> None:
        """Hand the pods their devices in the device plugin's order and start a process on each."""
        control = SimControl(sim.state_dir, sim.spec.preset)
        with sim.open() as gpus:
            snapshot = gpus.snapshot()
        try:
            resources = build_resources(snapshot, sim.config.pool, sim.config.device_plugin)
        except ResourceError as exc:
            raise SimulationError(f"node {sim.name}: {exc}") from exc
        taken: set[str] = set()
        for pod in pods:
            meta = pod["metadata"]
            key = f"{meta.get('namespace') or 'default'}/{meta['name']}"
            for resource, units in sorted(pod_requests(pod["spec"]).items()):
                devices = resources.get(resource)
                free = [d for d in devices.devices if d.id not in taken] if devices else []
                if len(free) < units:
                    raise SimulationError(
                        f"pod {key} on node {sim.name} requests {units} {resource}, but only "
                        f"{len(free)} are free there"
                    )
                for device in free[:units]:
                    taken.add(device.id)
                    if device.uuid in sim.holders:
                        continue  # another replica of a shared device: one process is enough
                    sim.holders[device.uuid] = key
                    mig_uuid = device.uuid if device.mig_profile is not None else None
                    try:
                        pid = control.add_process(device.gpu_index, mig_uuid)
                    except SimError as exc:
                        raise SimulationError(f"node {sim.name}: {exc}") from exc
                    sim.pids.setdefault(key, []).append(pid)

    def publish(self, name: str) -> SimulatedNode:
        """Recompute what node ``name``'s agent publishes (after a change on its GPUs)."""
        sim = self.nodes[name]
        with sim.open() as gpus:
            snapshot = gpus.snapshot()
        store = SnapshotStore()
        store.publish(snapshot)
        config = sim.config
        model = HealthModel(config.health, expected_driver=config.pool.expected_driver_version)
        model.on_snapshot(snapshot)
        exporter = MetricsExporter(config, store, health=model)
        exporter.render_latest()
        devices = tuple(
            PodDevice("", uuid, pod.split("/", 1)[1], pod.split("/", 1)[0], "main", 1)
            for uuid, pod in sorted(sim.holders.items())
        )
        allocations = Allocations(time.time(), True, pod_devices=devices)
        gpu_state = GpuStateAnnotation(store, model, lambda: allocations)
        capability = lbl.capability_labels(
            snapshot,
            lbl.NodeFacts(
                pool=config.node.pool, mig_strategy=str(config.device_plugin.mig_strategy)
            ),
        )
        if sim.spec.mig is not None:
            capability[lbl.MIG_LAYOUT] = lbl.label_value(sim.spec.mig.layout)
        flags = desired_flags(
            model.node_health(),
            config.health,
            capability,
            {**exporter.capacity_annotations(), **gpu_state()},
        )
        sim.labels = {**dict(flags.labels), **sim.spec.labels}
        sim.annotations = dict(flags.annotations)
        try:
            resources = build_resources(snapshot, config.pool, config.device_plugin)
        except ResourceError as exc:
            raise SimulationError(f"node {sim.name}: {exc}") from exc
        sim.allocatable = {r: len(res.devices) for r, res in resources.items()}
        sim.condition = {
            "type": lbl.GPU_HEALTHY_CONDITION,
            "status": "True" if flags.healthy else "False",
            "reason": flags.reason,
            "message": flags.message,
        }
        return sim

    # changes an operator would make (tests apply the diagnosis' suggestions with these)

    def change_mig(
        self, name: str, gpu: int, destroy: Sequence[MigSlot], create: Sequence[MigSlot]
    ) -> SimulatedNode:
        """Destroy idle instances and create new ones on one GPU, then republish the node."""
        sim = self.nodes[name]
        with sim.open() as gpus:
            instances = {i.slot: i for i in gpus.mig_instances(gpu)}
            for slot in destroy:
                gi = instances.get(slot)
                if gi is None:
                    raise SimulationError(f"node {name} GPU {gpu} has no instance {slot.label}")
                if gi.busy:
                    raise SimulationError(f"node {name} GPU {gpu}: {slot.label} is busy")
                try:
                    for ci in gi.compute_instances:
                        gpus.destroy_compute_instance(gpu, gi.instance_id, ci.instance_id)
                    gpus.destroy_gpu_instance(gpu, gi.instance_id)
                except GpuError as exc:
                    raise SimulationError(f"node {name} GPU {gpu}: {exc}") from exc
            for slot in create:
                try:
                    gpus.create_gpu_instance(gpu, slot.profile, slot.placement)
                except GpuError as exc:
                    raise SimulationError(f"node {name} GPU {gpu}: {exc}") from exc
        return self.publish(name)

    def release(self, pod: str) -> None:
        """A bound pod went away: its processes end and its devices are free again."""
        for sim in self.nodes.values():
            pids = sim.pids.pop(pod, [])
            if not pids and pod not in sim.holders.values():
                continue
            control = SimControl(sim.state_dir, sim.spec.preset)
            for pid in pids:
                control.remove_process(pid)
            sim.holders = {u: p for u, p in sim.holders.items() if p != pod}
            self.publish(sim.name)

    # API-shaped output

    def node_objects(self) -> list[JSON]:
        """Every Node, as the API server would list them."""
        return [n.manifest() for n in self.nodes.values()]

    def pod_objects(self, without: Sequence[str] = ()) -> list[JSON]:
        """Every Pod of the file (bound ones Running), minus the ``namespace/name``s given."""
        out = []
        for pod in self.cluster.pods:
            meta = dict(pod["metadata"])
            meta.setdefault("namespace", "default")
            key = f"{meta['namespace']}/{meta['name']}"
            if key in without:
                continue
            obj: JSON = {**pod, "metadata": meta}
            if (pod.get("spec") or {}).get("nodeName"):
                obj["status"] = {"phase": "Running"}
            out.append(obj)
        return out

    def kueue_objects(self, kind: str) -> list[JSON]:
        """The file's Kueue objects of one kind (``LocalQueue``, ``ClusterQueue``...)."""
        return [k.model_dump() for k in self.cluster.kueue if k.kind == kind]

    def workload_objects(self) -> list[JSON] | None:
        """The file's Kueue Workloads, with the one Kueue makes for each suspended Job that
        names a queue (and has none in the file); ``None`` when the file has neither Kueue
        objects nor such Jobs."""
        made = [w for w in map(_job_workload, self.cluster.jobs) if w is not None]
        if not self.cluster.kueue and not made:
            return None
        listed = self.kueue_objects("Workload")
        owned = {
            str(ref.get("uid"))
            for w in listed
            for ref in (w.get("metadata") or {}).get("ownerReferences") or ()
        }
        return listed + [w for w in made if w["metadata"]["ownerReferences"][0]["uid"] not in owned]


def _job_workload(job: Mapping[str, Any]) -> JSON | None:
    """The Workload Kueue's batch/v1 Job integration makes for a suspended Job that names a
    LocalQueue (label ``kueue.x-k8s.io/queue-name``), as it stands before admission: one pod
    set of ``parallelism`` pods from the Job's template, no conditions yet. None for a Job
    Kueue does not manage, or one not suspended (its pods, if any, are in the file)."""
    meta = job.get("metadata") or {}
    spec = job.get("spec") or {}
    queue = (meta.get("labels") or {}).get(lbl.KUEUE_QUEUE_NAME)
    if not queue or not spec.get("suspend"):
        return None
    namespace = meta.get("namespace") or "default"
    name = str(meta["name"])
    uid = str(meta.get("uid") or f"simulated-job-{namespace}-{name}")
    parallelism = spec.get("parallelism")
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": f"job-{name}",
            "namespace": namespace,
            "uid": f"simulated-workload-{uid}",
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": name,
                    "uid": uid,
                    "controller": True,
                }
            ],
        },
        "spec": {
            "queueName": queue,
            "podSets": [
                {
                    "name": "main",
                    "count": 1 if parallelism is None else int(parallelism),
                    "template": spec["template"],
                }
            ],
        },
    }
