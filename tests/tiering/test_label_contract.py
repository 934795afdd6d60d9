"""The label contract end to end: what the agent writes on a node is what tiering reads.

The agent side is the real code (capability labels, the health reporter's flags, its node
patcher under the agent's ServiceAccount); the node object is what the real API server returns
after the agent's patches (it refuses a label value Kubernetes does not allow); the tiering side
is its Node and selectors. Every label the agent owns goes through, with values that need
the sanitiser.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from nodeagent import labels as lbl
from nodeagent.config.health import HealthSection
from nodeagent.config.kubernetes import KubernetesSection
from nodeagent.health.model import HealthModel
from nodeagent.health.reporter import desired_flags
from nodeagent.kube.node_patcher import NodeFlags, NodePatcher, make_api
from nodeagent.sim.control import SimControl
from nodeagent_tiering.cluster.nodes import Node
from nodeagent_tiering.cluster.tier_policy import Operator, Requirement, Selector, Stability

# Kubernetes' rule for a label value (apimachinery validation.IsValidLabelValue).
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def published(control_plane, kube_nodes, kube_identities, flags: NodeFlags) -> dict[str, Any]:
    """The node as the API server returns it once the agent's patcher has applied ``flags``."""
    name = kube_nodes.create("gpu-1")
    section = KubernetesSection(enabled=True, kubeconfig=kube_identities.agent.kubeconfig.path)
    assert NodePatcher(name, make_api(section)).apply(flags)
    return kube_nodes.get("gpu-1")


def agent_flags(make_node, sim_state_dir, fault: str | None) -> tuple[NodeFlags, Any]:
    node = make_node("dgx-h100")
    if fault is not None:
        SimControl(sim_state_dir).inject(fault, 2)
    snapshot = node.snapshot()
    model = HealthModel(HealthSection(), expected_driver=None)
    model.on_snapshot(snapshot)
    facts = lbl.NodeFacts(pool="training pool (A)", mig_strategy="mixed")
    capability = lbl.capability_labels(snapshot, facts)
    capability[lbl.MIG_LAYOUT] = lbl.label_value("all balanced / v2")  # as the reconciler names it
    annotations = {lbl.FRAGMENTATION_ANNOTATION: "0.25"}
    return desired_flags(model.node_health(), model.config, capability, annotations), snapshot


@pytest.mark.parametrize(
    ("fault", "stability", "schedulable"),
    [
        pytest.param(None, Stability.STABLE, True, id="healthy node"),
        pytest.param("remap-pending", Stability.UNSTABLE, False, id="a GPU must be reset"),
    ],
)
def test_every_agent_label_reads_back_in_tiering(
    make_node, sim_state_dir, fault, stability, schedulable, control_plane, kube_nodes,
    kube_identities,
) -> None:  # fmt: skip
    flags, snapshot = agent_flags(make_node, sim_state_dir, fault)
    written = dict(flags.labels)
    # The MIG device attributes on nvidia.com/gpu exist only under the single strategy with MIG
    # devices (tests/agent/test_gfd_labels.py); every other agent label is always written.
    always = [k for k in lbl.AGENT_LABELS if k not in lbl.GPU_MIG_ATTRIBUTE_LABELS]
    assert set(always) <= set(written), "an agent label is never written"
    node = published(control_plane, kube_nodes, kube_identities, flags)
    view = Node.from_object(node)
    assert written.items() <= view.labels.items()
    assert set(view.labels) - set(written) == {"kubernetes.io/hostname", "kubernetes.io/os",
                                               "test.nodeagent.io/owner"}  # fmt: skip
    assert bool([t for t in view.taints if t.key == lbl.UNSTABLE_TAINT]) is flags.taint
    for key in always:
        value = written[key]
        assert len(value) <= 63, f"{key}={value!r}"
        assert LABEL_VALUE.match(value), f"{key}={value!r}"
        # Selected the way a tier selects it: by match label and by expression.
        assert Selector(match_labels={key: value}).matches(view.labels), key
        assert Requirement(key=key, operator=Operator.IN, values=(value,)).matches(view.labels), key
    assert view.gpus == len(snapshot.gpus)
    assert view.labels[lbl.DRIVER_VERSION] == lbl.label_value(snapshot.driver_version)
    assert view.labels[lbl.POOL] == "training-pool-A"
    assert view.stability is stability
    assert (view.condition_status == "True") is schedulable
    assert dict(flags.annotations)[lbl.FRAGMENTATION_ANNOTATION] == "0.25"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        pytest.param("570.124.06", "570.124.06", id="driver version unchanged"),
        pytest.param("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3", id="spaces"),
        pytest.param("  pool: a/b  ", "pool-a-b", id="runs and ends"),
        pytest.param("-x-" + "y" * 80, "x-" + "y" * 60, id="length"),
    ],
)
def test_one_sanitiser(text: str, value: str) -> None:
    assert lbl.label_value(text) == value
    assert LABEL_VALUE.match(lbl.label_value(text))
