"""The GPU-state annotation: what the agent publishes is what the service reads, exactly."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from nodeagent import labels as lbl
from nodeagent.agent.daemon import Agent
from nodeagent.agent.node_annotations import GpuStateAnnotation
from nodeagent.capacity import slice_model
from nodeagent.config.schema import load_agent_config
from nodeagent.gpu.node import GpuNode
from nodeagent.published import PublishedError, decode, encode, publish
from nodeagent.runtime.snapshots import SnapshotStore
from nodeagent.sim.control import SimControl
from nodeagent.testing.kube.controlplane import ControlPlane
from nodeagent.testing.kube.nodes import create_node
from nodeagent.testing.nodes import split_into
from nodeagent.testing.waiting import wait_until
from nodeagent_exporters.podresources import Allocations, PodDevice
from nodeagent_mig.planner import Instance, PlanError, plan_gpu


def _all_1g(node: GpuNode, sim_state_dir: Path) -> SimControl:
    control = SimControl(sim_state_dir)
    split_into(node, control, range(8), "1g.10gb")
    return control


def test_round_trip_keeps_every_fact(
    make_node: Callable[..., GpuNode], sim_state_dir: Path
) -> None:
    node = make_node("dgx-h100")
    control = _all_1g(node, sim_state_dir)
    busy = node.mig_instances(3)[2]
    assert busy.uuid is not None
    control.add_process(3, busy.uuid)
    snapshot = node.snapshot()
    published = publish(snapshot, {snapshot.gpus[5].info.uuid: "unhealthy"}, {busy.uuid: "a/b"})
    text = encode(published)
    assert decode(text).gpus == published.gpus
    assert decode(text).allocations_known
    # The geometry keeps what the planner searches with (NVML's profile IDs are not published).
    model = snapshot.gpus[0].info.name
    copy = decode(text).geometry(model)
    assert copy is not None
    assert slice_model(copy) == slice_model(published.geometries[model])
    # 8 GPUs x 7 instances, the model's rules and the flags fit in well under 2 kB.
    assert len(text) < 2048, len(text)
    gpu3 = decode(text).gpus[3]
    assert gpu3.mig is not None
    assert [(i.start, i.busy, i.allocated) for i in gpu3.mig][2] == (2, True, True)
    assert decode(text).gpus[5].health == "unhealthy"
    assert {g.island for g in decode(text).gpus} == {0}  # NVSwitch: one island


def test_nvlink_islands_of_bridged_pairs(make_node: Callable[..., GpuNode]) -> None:
    published = decode(encode(publish(make_node("pcie-h100nvl").snapshot())))
    assert [g.island for g in published.gpus] == [0, 0, 2, 2]
    assert [g.mig for g in published.gpus] == [None] * 4
    assert published.allocations_known is False


LAYOUTS = [
    pytest.param({"3g.40gb": 1, "1g.10gb": 2}, id="3g+1g"),
    pytest.param({"4g.40gb": 1, "1g.10gb": 3}, id="4g+1g"),
    pytest.param({"7g.80gb": 1}, id="7g"),
    pytest.param({"2g.20gb": 3, "1g.10gb": 1}, id="2g"),
]


@pytest.mark.parametrize("desired", LAYOUTS)
def test_the_planner_plans_the_same_on_the_published_geometry(
    make_node: Callable[..., GpuNode], sim_state_dir: Path, desired: dict[str, int]
) -> None:
    node = make_node("dgx-h100")
    _all_1g(node, sim_state_dir)
    real = node.mig_geometry(0)
    assert real is not None
    published = decode(encode(publish(node.snapshot())))
    copy = published.geometry(real.model)
    assert copy is not None
    current = [Instance.of(gi) for gi in node.mig_instances(0)]
    current[1] = Instance(current[1].profile, current[1].placement, busy=True)

    def outcome(geometry: Any) -> Any:
        try:
            plan = plan_gpu(geometry, current, desired)
        except PlanError as exc:
            return type(exc).__name__, exc.reason
        return plan.keep, plan.destroy, plan.create, dict(plan.creatable_after)

    assert outcome(copy) == outcome(real)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("{", id="not JSON"),
        pytest.param('{"v": 2, "gpus": []}', id="another version"),
        pytest.param('{"v": 1, "gpus": {}}', id="gpus not a list"),
        pytest.param('{"v": 1, "gpus": [{"i": "zero"}]}', id="index not a number"),
        pytest.param('{"v": 1, "gpus": [], "models": {"m": {"s": 8, "p": [["x"]]}}}', id="profile"),
    ],
)
def test_unreadable_annotations_are_errors_never_guesses(text: str) -> None:
    with pytest.raises(PublishedError):
        decode(text)


def test_the_provider_takes_health_and_pod_resources(
    make_node: Callable[..., GpuNode], sim_state_dir: Path
) -> None:
    node = make_node("dgx-h100")
    snapshot = node.snapshot()
    store = SnapshotStore()
    assert GpuStateAnnotation(store)() == {}
    store.publish(snapshot)
    gpu0 = snapshot.gpus[0].info.uuid
    held = Allocations(
        0.0,
        True,
        pod_devices=(
            PodDevice("nvidia.com/gpu", gpu0, "p", "ns", "c", 1),
            # A second pod on the same time-sliced GPU, and a second container of the first.
            PodDevice("nvidia.com/gpu", gpu0, "q", "ns", "c", 1),
            PodDevice("nvidia.com/gpu", gpu0, "p", "ns", "side", 1),
        ),
    )
    text = GpuStateAnnotation(store, None, lambda: held)()[lbl.GPU_STATE_ANNOTATION]
    published = decode(text)
    assert published.allocations_known
    assert published.gpus[0].holder in {"ns/p", "ns/q"}
    assert published.gpus[0].pods == ("ns/p", "ns/q")  # every pod a GPU remediation evicts
    assert published.gpus[1].holder is None
    assert published.gpus[1].pods == ()
    # The exporter's shared GPUs: interference of the worst device, and its workloads.
    shared = GpuStateAnnotation(store, None, lambda: held, lambda: {gpu0: (0.634, 2)})
    published = decode(shared()[lbl.GPU_STATE_ANNOTATION])
    assert (published.gpus[0].interference, published.gpus[0].shared_workloads) == (0.63, 2)
    assert published.gpus[1].interference is None
    unknown = Allocations(0.0, False, known=False)
    assert not decode(GpuStateAnnotation(store, None, lambda: unknown)()[
        lbl.GPU_STATE_ANNOTATION]).allocations_known  # fmt: skip


def test_the_running_agent_publishes_it_on_its_node(
    control_plane: ControlPlane, kube_ns: str, make_node: Callable[..., GpuNode], tmp_path: Path
) -> None:
    name = f"agent-{kube_ns[-5:]}"
    api = control_plane.api_client()
    create_node(api, name, gpus=8)
    config = tmp_path / "agent.yaml"
    config.write_text(
        f"version: v1\nstate_dir: {tmp_path / 'state'}\nnode: {{name: {name}, pool: infer}}\n"
        "sampler: {interval_s: 0.1}\nmig: {allow_reset: true}\n"
        f"device_plugin: {{enabled: false}}\n"
        f"metrics: {{pod_attribution: false, address: '127.0.0.1:0'}}\n"
        f"kubernetes: {{enabled: true, kubeconfig: '{control_plane.admin.path}'}}\n"
        "health: {report_interval_s: 1}\n"
        "pools:\n  infer: {mig_layout: all-balanced}\n"
    )
    node = make_node("dgx-h100")
    agent = Agent(load_agent_config(config, environ={}), node, config_path=config)
    core = client.CoreV1Api(api)
    agent.start()
    try:

        def published() -> Any:
            meta = core.read_node(name).metadata
            text = (meta.annotations or {}).get(lbl.GPU_STATE_ANNOTATION)
            if text is None:
                return None
            state = decode(text)
            return state if all(g.mig for g in state.gpus) else None

        assert wait_until(lambda: published() is not None, 30, 0.2)
        state = published()
        layout = [(gi.profile, gi.placement.start) for gi in node.mig_instances(0)]
        assert [(i.profile, i.start) for i in state.gpus[0].mig] == layout
        assert state.geometry("NVIDIA H100 80GB HBM3") is not None
        assert (
            json.loads(core.read_node(name).metadata.annotations[lbl.GPU_STATE_ANNOTATION])["v"]
            == 1
        )
    finally:
        agent.request_stop()
        agent.shutdown()
        core.delete_node(name)
