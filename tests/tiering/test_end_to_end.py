"""XID 79 on one agent's simulated node: quarantined, drained within the budget, and back.

The real pieces run end to end on the real control plane. In the first test the agent's health
model and reporter (under the agent's ServiceAccount) and the tiering controller (under its own)
run in this process on one fake clock, so hours of recovery pass in a second. In the second the
agent and the service are the processes an operator runs, on the wall clock: an XID injected
with ``nodeagent sim inject`` ends in pods evicted through the Eviction API.
"""

from __future__ import annotations

from nodeagent import labels as lbl
from nodeagent.config.health import HealthSection
from nodeagent.config.kubernetes import KubernetesSection
from nodeagent.health.component import make_patcher
from nodeagent.health.model import HealthModel
from nodeagent.health.reporter import Reporter
from nodeagent.sim.control import SimControl
from nodeagent.testing.kube import waiting
from nodeagent.testing.kube.processes import SimulatedAgent, TieringService
from nodeagent.testing.waiting import wait_until
from nodeagent_tiering.cluster.nodes import DRAIN_ANNOTATION, Node
from tests.tiering.conftest import LEASE_NAMESPACE, gpu_labels

NODE = "dgx-1"


def test_xid79_quarantines_drains_and_returns_the_node(
    cluster, make_controller, clock, make_node, sim_state_dir, tmp_path, kube_identities
):
    gpu_node = make_node("dgx-h100")
    facts = lbl.NodeFacts(pool="default", gpu_health="healthy", stability="stable")
    cluster.add_nodes({NODE: lbl.capability_labels(gpu_node.snapshot(), facts)})
    # Three more training nodes, so the tier keeps its minimum while dgx-1 is out.
    cluster.add_nodes({f"dgx-{i}": gpu_labels() for i in (2, 3, 4)})
    cluster.add_pod("trainer-0", NODE, labels={"app": "trainer"})
    dcgm = cluster.add_daemonset("dcgm", NODE)
    cluster.wait_running("trainer-0")

    # Short hold and half-life so that recovery takes simulated hours, not days.
    health = HealthSection(fatal_hold_s=1800, half_life_s=1800, recovery_quiet_s=300)
    model = HealthModel(health, history_path=tmp_path / "history.json", clock=clock)
    section = KubernetesSection(enabled=True, kubeconfig=kube_identities.agent.kubeconfig.path)
    name = cluster.nodes.name(NODE)
    reporter = Reporter(model, tmp_path, name, patcher=make_patcher(section, name))
    watcher = gpu_node.watch_events()
    ctl = make_controller()

    def agent_pass() -> None:
        while (event := watcher.wait(0.05)) is not None:
            model.on_event(event)
        model.on_snapshot(gpu_node.snapshot())
        model.tick()
        reporter.report_once()

    def tiering_pass() -> Node:
        ctl.cache.relist()
        ctl.reconcile_once()
        return Node.from_object(cluster.node(NODE))

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
    assert any(t.key == "nodeagent.io/quarantine" for t in view.taints)
    tiering_pass()  # evicts
    cluster.wait_gone("trainer-0")
    clock.advance(2)
    view = tiering_pass()  # finds the node empty
    assert dcgm in cluster.pods(), "DaemonSet pods stay"
    assert view.drain is not None
    assert view.drain.phase.value == "drained"
    assert "Xid" in view.drain.cause or "GPU" in view.drain.cause
    others = [Node.from_object(cluster.node(f"dgx-{i}")) for i in (2, 3, 4)]
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
    events = cluster.events(NODE)
    reasons = [e["reason"] for e in events]
    assert reasons.count("DrainStarted") == 1
    assert "NodeReturned" in reasons
    started = next(e for e in events if e["reason"] == "DrainStarted")
    assert "(tier training)" in started["message"]


def test_xid_on_a_running_agent_ends_in_a_real_drain(cluster, kube_identities, tmp_path):
    """``nodeagent run --simulate`` on a kubelet-less node and ``nodeagent tiering run``, each
    under its ServiceAccount: ``nodeagent sim inject xid --code 79`` on the node flags it, the
    service cordons it and evicts its pods through the Eviction API (one of them behind a
    PodDisruptionBudget), the kubelet stand-in finishes the deletions."""
    name = cluster.nodes.create(NODE)  # bare: what the agent publishes is all it carries
    cluster.add_nodes({f"dgx-{i}": gpu_labels() for i in (2, 3, 4)})
    for pod in ("trainer-0", "trainer-1"):
        cluster.add_pod(pod, NODE, labels={"app": "trainer"})
    cluster.add_pod("trainer-2", "dgx-2", labels={"app": "trainer"})
    cluster.wait_running("trainer-0", "trainer-1", "trainer-2")
    cluster.add_pdb("trainer", {"app": "trainer"}, min_available=2, healthy=3)
    agent = SimulatedAgent(name, kube_identities.agent.kubeconfig, tmp_path / "agent")
    service = TieringService(
        cluster.identity.kubeconfig,
        # Retry the budget's refusal soon: the test waits for it.
        cluster.policy_data(drain={"pdb_backoff_initial_s": 0.5, "pdb_backoff_max_s": 1}),
        tmp_path / "tiering",
        identity="e2e",
        namespace=LEASE_NAMESPACE,
        lease_name=cluster.lease_name,
    )

    def labelled(key: str, value: str) -> object:
        return lambda node: node["metadata"].get("labels", {}).get(key) == value

    with agent, service:
        waiting.node(
            cluster.api,
            name,
            labelled(lbl.TIER, "training"),
            what=lambda: (
                f"agent and tiering service: node {name} published and in tier "
                f"training\n{agent.log()}\n{service.log()}"
            ),
            timeout_s=60,
        )
        agent.inject("xid", 3, code=79)
        flagged = waiting.node(
            cluster.api,
            name,
            lambda node: node["spec"].get("unschedulable") is True,
            what=lambda: f"tiering service: node {name} cordoned after the XID\n{service.log()}",
        )
        assert waiting.condition(flagged, lbl.GPU_HEALTHY_CONDITION)["status"] == "False"
        assert flagged["metadata"]["labels"][lbl.TIER] == "quarantine"
        # The budget lets one trainer go; the other is refused until a replacement runs
        # elsewhere (as the trainers' own controller would start one).
        cluster.wait_pods(
            lambda pods: len({"trainer-0", "trainer-1"} - pods) == 1,
            what="tiering service: one trainer evicted within the PodDisruptionBudget",
        )
        # Only once the budget has refused the other (a drain step may come after this wait).
        assert wait_until(
            lambda: 429 in [code for _, code in cluster.calls("create", "pods/eviction")],
            timeout_s=30,
            step_s=0.2,
        ), f"the PodDisruptionBudget never refused the second trainer\n{service.log()}"
        cluster.add_pod("trainer-3", "dgx-3", labels={"app": "trainer"})
        cluster.wait_gone("trainer-0", "trainer-1")
        drained = waiting.node(
            cluster.api,
            name,
            lambda node: (
                '"phase":"drained"'
                in node["metadata"].get("annotations", {}).get(DRAIN_ANNOTATION, "")
            ),
            what=lambda: f"tiering service: node {name} drained\n{service.log()}",
        )
    record = Node.from_object(drained).drain
    assert record is not None
    assert record.evicted == 2
    assert record.blocked >= 1, "the budget refused the second trainer at first"
    evictions = cluster.calls("create", "pods/eviction")
    assert [code for _, code in evictions].count(201) == 2
    assert {pod for pod, code in evictions if code == 429} <= {"trainer-0", "trainer-1"}
    started = next(e for e in cluster.events(NODE) if e["reason"] == "DrainStarted")
    assert "(tier training)" in started["message"]
    assert "Xid" in started["message"] or "GPU" in started["message"]
