"""The diagnosis against kube-scheduler and Kueue on the real control plane.

A pod the pass calls blocked is one the scheduler reports Unschedulable; once the unblocking
change it names is made (the pods it names moved away, the MIG layout it names applied on the
node's simulated GPUs and advertised as the device plugin would), the scheduler binds it where
the change was made. ``simulate`` on a cluster file answers exactly as the pass over the same
cluster on the control plane. A pod Kueue holds for quota is ``quota``, never fragmentation.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from nodeagent.agent.mig_planning import plan_for_diagnosis
from nodeagent.agent.simulated import SimulatedCluster
from nodeagent.testing.kube.controlplane import ControlPlane
from nodeagent.testing.kube.nodes import create_node, pod_manifest
from nodeagent.testing.waiting import wait_until
from nodeagent_tiering.cluster.cluster_api import Kube
from nodeagent_tiering.cluster.clusterfile import load_cluster
from nodeagent_tiering.cluster.view import read_view, view_from_objects
from nodeagent_tiering.pending.diagnosis import Diagnoser, diagnose_some
from nodeagent_tiering.pending.results import PassResult, Reason, Settings
from nodeagent_tiering.simulate import simulate

EXAMPLES = Path(__file__).resolve().parents[3] / "docs" / "examples"
# Replayed onto the control plane: the examples of nodes and pods. The Kueue example states
# what its ClusterQueue has in use (a status the live Kueue computes from its own admissions,
# which a replay cannot hand it); it is checked against simulate in test_cli.py, and the same
# diagnosis against the live Kueue in test_a_suspended_job_waiting_for_quota_is_diagnosed_...
EXAMPLE_FILES = sorted(
    p for p in EXAMPLES.glob("cluster-*.yaml") if "\nkueue:" not in p.read_text(encoding="utf-8")
)


def unschedulable(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    pod = core.read_namespaced_pod(name, namespace)
    return any(
        c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
        for c in pod.status.conditions or []
    )


def bound_to(core: client.CoreV1Api, namespace: str, name: str) -> str | None:
    return core.read_namespaced_pod(name, namespace).spec.node_name


class Replay:
    """A simulated cluster file replayed onto the control plane, in namespaces of its own."""

    def __init__(self, plane: ControlPlane, prefix: str, simulated: SimulatedCluster) -> None:
        self.plane = plane
        self.api = plane.api_client()
        self.core = client.CoreV1Api(self.api)
        self.simulated = simulated
        self.prefix = prefix
        names = {p["metadata"].get("namespace") or "default" for p in simulated.cluster.pods}
        self.ns = {n: f"{prefix}-{n}"[:63].rstrip("-") for n in sorted(names)}
        self.nodes = [n["metadata"]["name"] for n in simulated.node_objects()]

    def start(self) -> Replay:
        for ns in self.ns.values():
            self.plane.create_namespace(ns)
        for node in self.simulated.node_objects():
            meta, spec = node["metadata"], node["spec"]
            create_node(
                self.api,
                meta["name"],
                meta["labels"],
                capacity=node["status"]["allocatable"],
                taints=spec.get("taints", ()),
                unschedulable=spec.get("unschedulable", False),
                annotations=meta["annotations"],
            )
        for pod in self.simulated.cluster.pods:
            body = json.loads(json.dumps(pod))
            for c in body["spec"]["containers"]:
                for part in ("limits", "requests"):  # YAML ints; the client wants strings
                    res = c.get("resources", {}).get(part)
                    if res:
                        c["resources"][part] = {k: str(v) for k, v in res.items()}
            ns = self.ns[body["metadata"].get("namespace") or "default"]
            body["metadata"]["namespace"] = ns
            self.core.create_namespaced_pod(ns, body)
        return self

    def stop(self) -> None:
        for name in self.nodes:
            self.core.delete_node(name)
        for ns in self.ns.values():
            self.plane.delete_namespace(ns)

    def pending(self) -> list[tuple[str, str]]:
        return [
            (self.ns[p["metadata"].get("namespace") or "default"], p["metadata"]["name"])
            for p in self.simulated.cluster.pods
            if not p["spec"].get("nodeName")
        ]

    def republish(self, name: str) -> None:
        """Advertise what the node's agent and device plugin publish now."""
        node = self.simulated.nodes[name].manifest()
        self.core.patch_node(name, {"metadata": {"annotations": node["metadata"]["annotations"]}})
        resources = node["status"]["allocatable"]
        self.core.patch_node_status(
            name, {"status": {"allocatable": resources, "capacity": resources}}
        )

    def diagnose(self) -> PassResult:
        kube = Kube(self.api)
        nodes = [n for n in kube.list_nodes()["items"] if n["metadata"]["name"] in self.nodes]
        pods = [
            p for p in kube.list_pods()["items"] if p["metadata"]["namespace"] in self.ns.values()
        ]
        workloads = kube.list_workloads()
        items = None if workloads is None else workloads.get("items") or []
        return Diagnoser(
            view_from_objects(nodes, pods, items), Settings(), plan_for_diagnosis
        ).run()

    def rename(self, text: str) -> str:
        for old, new in self.ns.items():
            text = text.replace(f"{old}/", f"{new}/")
        return text


@pytest.fixture(params=EXAMPLE_FILES, ids=[p.stem for p in EXAMPLE_FILES])
def replay(
    request: pytest.FixtureRequest, control_plane: ControlPlane, kube_ns: str, kubelets: Any,
    tmp_path: Path,
) -> Iterator[Replay]:  # fmt: skip
    path: Path = request.param
    simulated = SimulatedCluster(load_cluster(path), path.parent, tmp_path / "sim")
    played = Replay(control_plane, f"pending-{kube_ns[-5:]}", simulated).start()
    try:
        yield played
    finally:
        played.stop()


def _without_scheduler_message(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in e.items() if k != "scheduler"} for e in entries]


def test_simulate_answers_as_the_pass_over_the_control_plane(replay: Replay) -> None:
    core = replay.core
    for ns, name in replay.pending():
        assert wait_until(lambda ns=ns, name=name: unschedulable(core, ns, name), 60, 0.2), name
    live = replay.diagnose()
    offline = simulate(
        replay.simulated.node_objects(),
        replay.simulated.pod_objects(),
        replay.simulated.workload_objects(),
        None,
        plan_for_diagnosis,
        now_s=time.time(),
    )
    expected = json.loads(replay.rename(json.dumps(offline.result.to_json()["pending"])))
    assert _without_scheduler_message(live.to_json()["pending"]) == _without_scheduler_message(
        expected
    )
    # Every pod it calls blocked by fragmentation is Unschedulable in kube-scheduler.
    assert {d.reason for d in live.diagnoses} <= {Reason.CONTIGUITY_GPUS, Reason.CONTIGUITY_MIG}
    assert all("Insufficient" in d.message for d in live.diagnoses)


def test_the_named_change_lets_the_scheduler_bind_it(replay: Replay) -> None:
    core = replay.core
    for ns, name in replay.pending():
        assert wait_until(lambda ns=ns, name=name: unschedulable(core, ns, name), 60, 0.2), name
    (d,) = replay.diagnose().diagnoses
    assert d.unblock is not None, d.evidence
    if d.unblock.kind == "move-pods":
        for pod in d.unblock.pods:
            ns, name = pod.split("/", 1)
            core.delete_namespaced_pod(name, ns)
    else:
        assert d.unblock.kind == "mig-layout"
        for change in d.unblock.changes:
            replay.simulated.change_mig(d.unblock.node, change.gpu, change.destroy, change.create)
        replay.republish(d.unblock.node)
    assert wait_until(lambda: bound_to(core, d.namespace, d.name) is not None, 60, 0.2)
    assert bound_to(core, d.namespace, d.name) == d.unblock.node


QUEUE = "kueue.x-k8s.io/queue-name"


@pytest.fixture
def queue(control_plane: ControlPlane, kube_ns: str) -> Iterator[str]:
    """A LocalQueue ``q`` in the test's namespace over a ClusterQueue of 8 GPUs."""
    rf, cq = f"{kube_ns}-rf", f"{kube_ns}-cq"
    control_plane.apply(
        [
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
             "metadata": {"name": rf}},
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
             "metadata": {"name": cq},
             "spec": {"namespaceSelector": {}, "resourceGroups": [{
                 "coveredResources": ["nvidia.com/gpu"],
                 "flavors": [{"name": rf, "resources": [
                     {"name": "nvidia.com/gpu", "nominalQuota": 8}]}]}]}},
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
             "metadata": {"name": "q", "namespace": kube_ns}, "spec": {"clusterQueue": cq}},
        ]
    )  # fmt: skip
    yield "q"
    control_plane.kubectl("delete", "clusterqueue", cq, "--wait=false")
    control_plane.kubectl("delete", "resourceflavor", rf, "--wait=false")


def test_quota_is_never_called_fragmentation(
    control_plane: ControlPlane, kube_ns: str, kubelets: Any, queue: str
) -> None:
    api = control_plane.api_client()
    core = client.CoreV1Api(api)
    nodes = [f"quota-{kube_ns[-5:]}-a", f"quota-{kube_ns[-5:]}-b"]
    for node in nodes:
        create_node(api, node, {"pool": kube_ns[-5:]}, gpus=8)
    try:
        # 4 + 4 GPUs in use outside Kueue: fragmented for an 8-GPU pod.
        for i, node in enumerate(nodes):
            core.create_namespaced_pod(kube_ns, pod_manifest(f"run-{i}", gpus=4, node_name=node))
        selector = {"pool": kube_ns[-5:]}
        labels = {QUEUE: queue}
        core.create_namespaced_pod(
            kube_ns, pod_manifest("fits-quota", gpus=8, labels=labels, node_selector=selector)
        )
        core.create_namespaced_pod(
            kube_ns, pod_manifest("over-quota", gpus=8, labels=labels, node_selector=selector)
        )
        kube = Kube(api)

        def diagnosed() -> dict[str, Reason]:
            nodes_ = [n for n in kube.list_nodes()["items"] if n["metadata"]["name"] in nodes]
            pods = [p for p in kube.list_pods()["items"] if p["metadata"]["namespace"] == kube_ns]
            workloads = kube.list_workloads()
            assert workloads is not None, "Kueue runs in the harness"
            view = view_from_objects(nodes_, pods, workloads.get("items") or [])
            found = Diagnoser(view, Settings(), plan_for_diagnosis).run()
            return {d.name: d.reason for d in found.diagnoses}

        # Kueue admits one 8-GPU pod (quota 8) and holds the other; the admitted one is then
        # unschedulable for fragmentation (kueue#4329).
        def settled() -> bool:
            found = diagnosed()
            return sorted(found.values()) == sorted([Reason.CONTIGUITY_GPUS, Reason.QUOTA])

        assert wait_until(settled, 60, 0.5), diagnosed()
        found = diagnosed()
        (admitted,) = [n for n, r in found.items() if r is Reason.CONTIGUITY_GPUS]
        assert wait_until(lambda: unschedulable(core, kube_ns, admitted), 30, 0.2)
    finally:
        for node in nodes:
            core.delete_node(node)


def suspended_job(name: str, queue: str, *, pods: int, gpus_each: int) -> dict[str, Any]:
    """A batch/v1 Job as a Kueue user submits it: suspended, labelled with its LocalQueue."""
    template = pod_manifest("main", gpus=gpus_each)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {QUEUE: queue}},
        "spec": {
            "suspend": True,
            "parallelism": pods,
            "completions": pods,
            "template": {
                "metadata": {"labels": {}},
                "spec": {**template["spec"], "restartPolicy": "Never"},
            },
        },
    }


def test_a_suspended_job_waiting_for_quota_is_diagnosed_with_kueues_numbers(
    control_plane: ControlPlane, kube_ns: str
) -> None:
    """The usual Kueue path: a Job has no pod until admitted. Its Workload is the unit: the
    job is named, Kueue's own message quoted, and the ClusterQueue's and cohort's arithmetic
    agrees with what Kueue says is missing; the Event lands on the Job."""
    from typer.testing import CliRunner

    from nodeagent.cli.tiering import app
    from nodeagent_tiering.pending.events import COMPONENT, EVENT_REASONS, PodEvents

    rf, cq, lender, cohort = (f"{kube_ns}-{s}" for s in ("rf", "cq", "lender", "pool"))

    def queue_of(name: str, gpus: int, **limits: int) -> dict[str, Any]:
        return {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
            "metadata": {"name": name},
            "spec": {"namespaceSelector": {}, "cohortName": cohort, "resourceGroups": [{
                "coveredResources": ["nvidia.com/gpu"],
                "flavors": [{"name": rf, "resources": [
                    {"name": "nvidia.com/gpu", "nominalQuota": gpus, **limits}]}]}]},
        }  # fmt: skip

    control_plane.apply(
        [
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
             "metadata": {"name": rf}},
            queue_of(cq, 8),
            queue_of(lender, 4, lendingLimit=2),
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
             "metadata": {"name": "q", "namespace": kube_ns}, "spec": {"clusterQueue": cq}},
        ]
    )  # fmt: skip
    api = control_plane.api_client()
    batch = client.BatchV1Api(api)
    kube = Kube(api)
    try:
        # 8 of the queue's 8 go to the first job; the second asks 12 and the cohort lends 2.
        batch.create_namespaced_job(kube_ns, suspended_job("small", "q", pods=2, gpus_each=4))
        assert wait_until(
            lambda: batch.read_namespaced_job("small", kube_ns).spec.suspend is False, 60, 0.2
        ), "Kueue admits the job that fits its queue"
        # The queue has 0 left of its 8; the cohort lends 2 at most: 10 is all it can ever have.
        batch.create_namespaced_job(kube_ns, suspended_job("big", "q", pods=2, gpus_each=4))
        batch.create_namespaced_job(kube_ns, suspended_job("huge", "q", pods=3, gpus_each=4))
        access = ["--kubeconfig", str(control_plane.admin.path)]
        seen: list[str] = []

        def entry(job: str, kueue_says: str) -> dict[str, Any] | None:
            out = CliRunner().invoke(app, ["why-pending", job, "-n", kube_ns, "--json", *access])
            seen.append(out.output)
            entries = json.loads(out.output)["pending"] if out.exit_code == 0 else []
            return entries[0] if entries and kueue_says in entries[0]["evidence"] else None

        # Kueue's own word, then the same numbers from the objects it reads (the ClusterQueue's
        # status.flavorsUsage follows the admission a moment later).
        assert wait_until(lambda: entry("big", "6 more needed") is not None, 60, 0.5), seen[-1]
        numbers = (
            f"ClusterQueue {cq} (cohort {cohort}): nvidia.com/gpu in flavor {rf}: 8 guaranteed, "
            "8 in use, the cohort could lend 2: short 6 of the 8 asked"
        )
        assert wait_until(lambda: entry("big", numbers) is not None, 30, 0.5), seen[-1]
        big = entry("big", "")
        assert big is not None
        assert (big["pod"], big["kind"], big["reason"]) == (f"{kube_ns}/big", "Job", "quota")
        assert big["request"] == {"nvidia.com/gpu": 8}
        assert big["evidence"].startswith(f"Job {kube_ns}/big waits in Kueue for quota")
        assert wait_until(lambda: entry("huge", "maximum capacity (10)") is not None, 60, 0.5), (
            seen[-1]
        )
        huge = entry("huge", "")
        assert huge is not None
        assert (
            "the 12 asked are more than it can ever admit (10 with the whole cohort idle)"
            in (huge["evidence"])
        )
        # The admitted job's pods exist: they are diagnosed as pods, its Workload is not.
        everything = CliRunner().invoke(app, ["why-pending", "-n", kube_ns, "--json", *access])
        kinds = sorted(e["kind"] for e in json.loads(everything.output)["pending"])
        assert kinds == ["Job", "Job", "Pod", "Pod"], everything.output
        table = CliRunner().invoke(app, ["why-pending", "big", "-n", kube_ns, *access])
        assert f"Job/{kube_ns}/big" in table.output, table.output

        view = read_view(kube)
        found = diagnose_some(view, plan_for_diagnosis, Settings(), namespace=kube_ns, pod="big")
        events = PodEvents(kube, instance="test")
        assert [how for how, _ in events.observe(found.diagnoses, time.time())] == ["created"]
        job_uid = batch.read_namespaced_job("big", kube_ns).metadata.uid
        recorded = client.CoreV1Api(api).list_namespaced_event(
            kube_ns, field_selector=f"involvedObject.uid={job_uid}"
        )
        # Kueue and the job controller record theirs on the Job too.
        (event,) = [e for e in recorded.items if e.source.component == COMPONENT]
        assert event.involved_object.kind == "Job"
        assert event.reason == EVENT_REASONS[Reason.QUOTA]
    finally:
        for job in ("small", "big", "huge"):
            control_plane.kubectl("delete", "job", job, "-n", kube_ns, "--wait=false")
        for name in (cq, lender):
            control_plane.kubectl("delete", "clusterqueue", name, "--wait=false")
        control_plane.kubectl("delete", "resourceflavor", rf, "--wait=false")
