"""XID 79 on one agent's simulated node: quarantined, drained within the budget, and back.

The real pieces run end to end: a simulated DGX H100 (NVML simulator), the agent's health model
and reporter patching its node through the API stand-in, the capability labels, and the tiering
controller. One fake clock drives the health model and the controller, so hours pass in a
second.
"""

from __future__ import annotations

from nodeagent import labels as lbl
from nodeagent.config.health import HealthSection
from nodeagent.config.kubernetes import KubernetesSection
from nodeagent.health.component import make_patcher
from nodeagent.health.model import HealthModel
from nodeagent.health.reporter import Reporter
from nodeagent.sim.control import SimControl
from nodeagent_tiering.nodes import DRAIN_ANNOTATION, NodeView
from tests.support.kubeapi import make_node as make_node_object
from tests.support.kubeapi import make_pod
from tests.tiering.conftest import add_nodes, gpu_labels

NODE = "dgx-1"


def test_xid79_quarantines_drains_and_returns_the_node(
    api, make_controller, clock, make_node, sim_state_dir, tmp_path
):
    gpu_node = make_node("dgx-h100")
    facts = lbl.NodeFacts(pool="default", gpu_health="healthy", stability="stable")
    labels = lbl.capability_labels(gpu_node.snapshot(), facts)
    api.put("nodes", make_node_object(NODE, labels, gpu_healthy=None))
    # Three more training nodes, so the tier keeps its minimum while dgx-1 is out.
    add_nodes(api, {f"dgx-{i}": gpu_labels() for i in (2, 3, 4)})
    api.put("pods", make_pod("trainer-0", NODE, labels={"app": "trainer"}))
    api.put("pods", make_pod("dcgm", NODE, owner_kind="DaemonSet"))

    # Short hold and half-life so that recovery takes simulated hours, not days.
    health = HealthSection(fatal_hold_s=1800, half_life_s=1800, recovery_quiet_s=300)
    model = HealthModel(health, history_path=tmp_path / "history.json", clock=clock)
    patcher = make_patcher(KubernetesSection(enabled=True, api_server=api.url), NODE)
    reporter = Reporter(model, tmp_path, NODE, patcher=patcher)
    watcher = gpu_node.watch_events()
    ctl = make_controller()

    def agent_pass() -> None:
        while (event := watcher.wait(0.05)) is not None:
            model.on_event(event)
        model.on_snapshot(gpu_node.snapshot())
        model.tick()
        reporter.report_once()

    def tiering_pass() -> NodeView:
        ctl.cache.relist()
        ctl.reconcile_once()
        return NodeView.from_object(api.get("nodes", NODE))

    agent_pass()
    view = tiering_pass()
    assert view.labels[lbl.TIER] == "training"
    assert view.condition_status == "True"

    SimControl(sim_state_dir).inject("xid", 3, code=79)
    agent_pass()
    view = tiering_pass()
    assert view.condition_status == "False", "the agent flagged the node"
    assert view.unschedulable
    assert view.labels[lbl.TIER] == "quarantine"
    assert any(t["key"] == "nodeagent.io/quarantine" for t in view.taints)
    view = tiering_pass()
    assert api.get("pods", "trainer-0", "default") is None, "the job was evicted"
    assert api.get("pods", "dcgm", "default") is not None, "DaemonSet pods stay"
    assert view.drain is not None
    assert view.drain.phase.value == "drained"
    assert "Xid" in view.drain.cause or "GPU" in view.drain.cause
    others = [NodeView.from_object(api.get("nodes", f"dgx-{i}")) for i in (2, 3, 4)]
    assert not any(o.unschedulable for o in others), "one drain at a time, tier kept"

    # The fault clears (the node was rebooted). It must stay clear for the recovery period.
    SimControl(sim_state_dir).clear(3)
    cleared_at = None
    released_at = None
    for _ in range(200):
        clock.advance(300)
        agent_pass()
        view = tiering_pass()
        if (
            cleared_at is None
            and view.condition_status == "True"
            and (view.labels.get(lbl.STABILITY) != "unstable")
        ):
            cleared_at = clock()
        if released_at is None and not view.unschedulable:
            released_at = clock()
        if view.labels.get(lbl.TIER) == "training":
            break
    assert cleared_at is not None, "the agent cleared the condition"
    assert released_at is not None
    assert released_at - cleared_at >= ctl.policy.recovery_period_s, "hysteresis"
    assert view.labels[lbl.TIER] == "training", "back in its tier once stable again"
    assert DRAIN_ANNOTATION not in view.annotations
    reasons = [e["reason"] for e in api.list("events") if e["involvedObject"]["name"] == NODE]
    assert reasons.count("DrainStarted") == 1
    assert "NodeReturned" in reasons
    record_events = [e for e in api.list("events") if e["reason"] == "DrainStarted"]
    assert "(tier training)" in record_events[0]["message"]
