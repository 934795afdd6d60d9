"""What Kueue does with the rendered quota: admission within guarantees, borrowing up to the
borrow limit, hard quota that is never lent, lending limits, and reclaim by preemption.

Every test renders a policy, applies it with nodeagent's own apply (server-side, field manager
nodeagent), and submits pods with ``kueue.x-k8s.io/queue-name`` onto kubelet-less GPU nodes of
the tier; Kueue and kube-scheduler decide, the test only reads what they decided.
"""

from __future__ import annotations

from typing import Any

from nodeagent_tiering.quota.apply import apply_objects
from nodeagent_tiering.quota.policy import render
from tests.tiering.quota.conftest import KueueEnv, condition, quota_policy, wait_for


def setup_tier(env: KueueEnv, teams: dict[str, dict[str, Any]], settings=None):
    """One tier of the test's own, its teams each in a namespace, the policy applied.
    Returns ``(team -> namespace, tier)``."""
    tier = env.name("train")
    namespaces = {team: env.namespace(team) for team in teams}
    data: dict[str, Any] = {
        "version": "v1",
        "teams": [
            {"name": env.name(team), "namespaces": [namespaces[team]], "tiers": {tier: spec}}
            for team, spec in teams.items()
        ],
    }
    if settings:
        data["tiers"] = {tier: settings}
    report = apply_objects(env.kube, env.api, render(quota_policy(data), env.api))
    assert report.ok, report.lines()
    return namespaces, tier


def admitted(env: KueueEnv, namespace: str) -> set[str]:
    return {
        pod for pod, wl in env.workloads(namespace).items() if condition(wl, "Admitted") == "True"
    }


def pending_message(env: KueueEnv, namespace: str, pod: str) -> str:
    wl = env.workloads(namespace).get(pod)
    if wl is None:  # Kueue makes the pod's Workload a moment after the pod
        return ""
    for c in wl.get("status", {}).get("conditions", []):
        if c["type"] == "QuotaReserved":
            return str(c.get("message", ""))
    return ""


def usage(env: KueueEnv, cluster_queue: str, want: tuple[str, str]) -> tuple[str, str]:
    """The ClusterQueue's GPU usage (total, borrowed) once Kueue's status shows ``want``."""

    def read() -> tuple[str, str] | None:
        status = env.cluster_queue(cluster_queue).get("status") or {}
        for flavor in status.get("flavorsUsage") or ():
            for res in flavor.get("resources") or ():
                if res["name"] == "nvidia.com/gpu" and (res["total"], res["borrowed"]) == want:
                    return want
        return None

    return wait_for(read, what=f"{cluster_queue} usage {want}")


def gpus(guaranteed: int, **extra: Any) -> dict[str, Any]:
    return {"resources": {"nvidia.com/gpu": {"guaranteed": guaranteed, **extra}}}


def test_borrowing_then_reclaim_by_preemption(env):
    ns, tier = setup_tier(
        env,
        {"owner": {"reclaimable": True, **gpus(4)}, "burst": gpus(4, borrow=4)},
    )
    env.node("n1", tier)
    for name in ("b1", "b2"):
        env.pod(ns["burst"], name, gpus=4, queue=tier)
    wait_for(lambda: admitted(env, ns["burst"]) == {"b1", "b2"}, what="burst to borrow 4")
    # 4 of the 8 are the owner's, lent.
    usage(env, f"{env.name('burst')}-{tier}", ("8", "4"))

    env.pod(ns["owner"], "o1", gpus=4, queue=tier)
    wait_for(lambda: admitted(env, ns["owner"]) == {"o1"}, what="the owner to reclaim")
    reasons = wait_for(
        lambda: [
            (e.involved_object.name, e.message)
            for e in env.core.list_namespaced_event(ns["burst"]).items
            if e.reason == "Preempted"
        ],
        what="Kueue to record the preemption",
    )
    assert len(reasons) == 1
    assert "reclamation within the cohort" in reasons[0][1]
    assert len(admitted(env, ns["burst"])) == 1, "the borrower keeps its own guarantee"


def test_lent_quota_that_is_not_reclaimable_waits_for_the_borrower(env):
    ns, tier = setup_tier(env, {"owner": gpus(4), "burst": gpus(4, borrow=4)})
    env.node("n1", tier)
    for name in ("b1", "b2"):
        env.pod(ns["burst"], name, gpus=4, queue=tier)
    wait_for(lambda: admitted(env, ns["burst"]) == {"b1", "b2"}, what="burst to borrow")
    env.pod(ns["owner"], "o1", gpus=4, queue=tier)
    message = wait_for(
        lambda: pending_message(env, ns["owner"], "o1"), what="the owner's workload to wait"
    )
    assert "insufficient unused quota" in message
    assert admitted(env, ns["owner"]) == set()
    assert admitted(env, ns["burst"]) == {"b1", "b2"}, "nobody was preempted"


def test_hard_quota_is_never_lent_and_borrow_limits_hold(env):
    ns, tier = setup_tier(
        env,
        {
            "critical": gpus(4, type="hard"),
            "spare": gpus(6, lend=2),
            "burst": gpus(2, borrow="unlimited"),
        },
    )
    env.node("n1", tier, gpus=16)
    for name in ("b1", "b2", "b3"):
        env.pod(ns["burst"], name, gpus=2, queue=tier)
    # 2 of its own + 2 that spare may lend; none of critical's 4 although they are idle.
    wait_for(lambda: len(admitted(env, ns["burst"])) == 2, what="burst to borrow what it may")
    (waiting,) = {"b1", "b2", "b3"} - admitted(env, ns["burst"])
    message = wait_for(lambda: pending_message(env, ns["burst"], waiting), what="a wait reason")
    assert "insufficient unused quota" in message
    usage(env, f"{env.name('burst')}-{tier}", ("4", "2"))
    # The critical team gets all of its hard quota at once.
    env.pod(ns["critical"], "c1", gpus=4, queue=tier)
    wait_for(lambda: admitted(env, ns["critical"]) == {"c1"}, what="critical's own quota")


def test_borrow_limit_caps_what_a_team_takes(env):
    ns, tier = setup_tier(env, {"idle": gpus(6), "small": gpus(2, borrow=2)})
    env.node("n1", tier)
    for name in ("s1", "s2", "s3"):
        env.pod(ns["small"], name, gpus=2, queue=tier)
    wait_for(lambda: len(admitted(env, ns["small"])) == 2, what="2 own + 2 borrowed")
    (waiting,) = {"s1", "s2", "s3"} - admitted(env, ns["small"])
    assert "insufficient unused quota" in wait_for(
        lambda: pending_message(env, ns["small"], waiting), what="a wait reason"
    )


def test_mig_profiles_and_tainted_tiers_are_admitted_onto_their_nodes(env):
    taint = {"key": "nodeagent.io/dedicated", "value": env.uid, "effect": "NoSchedule"}
    ns, tier = setup_tier(
        env,
        {"infer": {"resources": {"nvidia.com/mig-1g.10gb": {"guaranteed": 7}}}},
        settings={"taints": [taint]},
    )
    node = env.node("mig", tier, gpus=0, capacity={"nvidia.com/mig-1g.10gb": "7"}, taints=[taint])
    env.pod(ns["infer"], "m1", resources={"nvidia.com/mig-1g.10gb": "3"}, queue=tier)
    env.pod(ns["infer"], "m2", resources={"nvidia.com/mig-1g.10gb": "5"}, queue=tier)
    wait_for(lambda: admitted(env, ns["infer"]) == {"m1"}, what="3 of 7 MIG devices admitted")
    pod = wait_for(
        lambda: (p := env.core.read_namespaced_pod("m1", ns["infer"])).spec.node_name and p,
        what="the admitted pod to be scheduled",
    )
    assert pod.spec.node_name == node, "the flavor's toleration let it onto the tainted node"
    assert any(t.key == taint["key"] and t.value == taint["value"] for t in pod.spec.tolerations), (
        "Kueue added the flavor's toleration"
    )
    assert "insufficient unused quota" in wait_for(
        lambda: pending_message(env, ns["infer"], "m2"), what="m2 to wait for quota"
    )
