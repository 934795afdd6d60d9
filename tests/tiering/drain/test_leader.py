"""Leader election over a real coordination.k8s.io/v1 Lease: one actor at a time, failover within
the lease duration, the circuit breaker stored on the Lease.

The first tests pace two electors with a fake clock in this process (the lease timing to the
second); the last runs two ``nodeagent tiering run`` processes and kills the leader with
SIGKILL.
"""

from __future__ import annotations

import json
import time

import pytest

from nodeagent import labels as lbl
from nodeagent.testing.kube import waiting
from nodeagent.testing.kube.processes import TieringService
from nodeagent.testing.waiting import wait_until
from nodeagent_tiering.cluster.cluster_api import KubeError
from nodeagent_tiering.drain.leader import (
    BREAKER_ANNOTATION,
    breaker_from_lease,
    reset_breaker_on_lease,
)
from tests.tiering.conftest import LEASE_NAMESPACE, gpu_labels

T4 = gpu_labels("Tesla-T4", count=1, nvlink=1)


def test_only_the_leader_acts_and_failover_happens_within_the_lease(
    cluster, make_controller, clock
):
    cluster.add_nodes({f"n{i}": T4 for i in range(4)}, gpus=1)
    cluster.add_pod("job", "n0")
    cluster.wait_running("job")
    a = make_controller(elect=True, identity="a")
    b = make_controller(elect=True, identity="b")
    assert a.elector.try_acquire_or_renew()
    assert not b.elector.try_acquire_or_renew(), "the lease is held"
    a.reconcile_once()
    b.reconcile_once()
    assert len(cluster.calls("patch", "nodes")) == 4, "only the leader labels the nodes"

    cluster.set_stability("n0", "unstable")
    a.cache.relist()
    b.cache.relist()
    a.reconcile_once()  # a cordons n0, then dies before evicting
    assert cluster.node("n0")["spec"]["unschedulable"] is True

    # a stops renewing. b must not take over before the lease duration has passed, and a must
    # stop acting (renew deadline 10 s) before b may start (lease 15 s).
    clock.advance(10)
    assert not a.may_act()
    assert not b.elector.try_acquire_or_renew()
    clock.advance(5)
    assert b.elector.try_acquire_or_renew()
    assert cluster.lease()["spec"]["holderIdentity"] == "b"
    assert cluster.lease()["spec"]["leaseTransitions"] == 1
    b.cache.relist()
    b.reconcile_once()
    a.cache.relist()
    a.reconcile_once()  # the old leader wakes up: it must not act
    assert cluster.reasons("n0").count("DrainStarted") == 1, "the drain was started once"
    assert cluster.calls("create", "pods/eviction") == [("job", 201)]
    cluster.wait_gone("job")  # the new leader finished the drain


def test_stale_write_to_the_lease_is_refused(cluster, make_controller, clock):
    a = make_controller(elect=True, identity="a")
    b = make_controller(elect=True, identity="b")
    assert a.elector.try_acquire_or_renew()
    clock.advance(16)
    # b has never seen the lease change: expiry counts from its own first observation.
    assert not b.elector.try_acquire_or_renew()
    clock.advance(16)
    # Both see an expired lease; the one that writes second holds a stale resourceVersion.
    stale = cluster.lease()
    assert b.elector.try_acquire_or_renew()
    stale["spec"]["holderIdentity"] = "a"
    with pytest.raises(KubeError) as refused:
        a.kube.replace_lease(LEASE_NAMESPACE, cluster.lease_name, stale)
    assert refused.value.status == 409
    assert cluster.lease()["spec"]["holderIdentity"] == "b"


def test_breaker_trips_is_persisted_on_the_lease_and_needs_a_reset(cluster, make_controller, clock):
    cluster.add_nodes({f"n{i}": T4 for i in range(6)}, gpus=1)
    ctl = make_controller(elect=True, identity="a")
    assert ctl.elector.try_acquire_or_renew()
    ctl.reconcile_once()
    for i in range(4):
        cluster.set_stability(f"n{i}", "unstable")
    ctl.cache.relist()
    result = ctl.reconcile_once()
    assert result.tripped
    lease = cluster.lease()
    assert breaker_from_lease(lease).open
    # The Event is about the Lease, in its namespace.
    (event,) = waiting.events(
        cluster.api,
        cluster.lease_name,
        lambda events: events,
        namespace=LEASE_NAMESPACE,
        what=f"tiering: an Event about Lease {cluster.lease_name}",
    )
    assert event["reason"] == "CircuitBreakerOpen"
    assert event["involvedObject"]["uid"] == lease["metadata"]["uid"]
    assert ctl.metrics.registry.get_sample_value("nodeagent_tiering_circuit_breaker_open") == 1

    def cordoned() -> int:
        return sum(1 for i in range(6) if cluster.node(f"n{i}")["spec"].get("unschedulable"))

    assert cordoned() == 0

    # A new leader inherits the open breaker.
    other = make_controller(elect=True, identity="b")
    assert not other.elector.try_acquire_or_renew()
    clock.advance(20)
    assert other.elector.try_acquire_or_renew()
    other.reconcile_once()
    assert other.breaker.open
    assert cordoned() == 0

    # The operator resets it (what `nodeagent tiering reset-breaker` writes).
    reset_breaker_on_lease(other.kube, LEASE_NAMESPACE, cluster.lease_name, now_s=clock())
    clock.advance(1)
    other.elector.try_acquire_or_renew()
    other.elector.try_acquire_or_renew()
    other.reconcile_once()
    assert not other.breaker.open
    annotation = json.loads(cluster.lease()["metadata"]["annotations"][BREAKER_ANNOTATION])
    assert annotation["state"] == "closed"
    assert cordoned() == 2, "drains resume within the cluster budget of 2"


def test_two_service_processes_one_leader_and_failover_after_kill_9(
    cluster, control_plane, kube_identities, tmp_path
):
    """Two replicas as processes, each under its own ServiceAccount bound by the manifests'
    roles: the standby never writes, the leader's SIGKILL hands over within the lease, the
    new leader carries on without repeating the old one's drain, and between them the replicas
    asked for exactly what the manifests grant."""
    cluster.add_nodes({f"n{i}": T4 for i in range(4)}, gpus=1)
    cluster.add_pod("job-0", "n0")
    cluster.add_pod("job-1", "n1")
    cluster.wait_running("job-0", "job-1")
    policy = cluster.policy_data(recovery_period_s=3600)
    second = kube_identities.tiering_replica(control_plane, "nodeagent-tiering-b")
    users = {"a": cluster.identity.user, "b": second.user}
    common = {"namespace": LEASE_NAMESPACE, "lease_name": cluster.lease_name}
    a = TieringService(cluster.identity.kubeconfig, policy, tmp_path, identity="a", **common)
    b = TieringService(second.kubeconfig, policy, tmp_path, identity="b", **common)

    def holder() -> str:
        try:
            return str(cluster.lease()["spec"].get("holderIdentity") or "")
        except Exception:  # noqa: BLE001 - not created yet
            return ""

    with a:
        assert wait_until(lambda: holder() == "a", timeout_s=30), a.log()
        for i in range(4):
            waiting.node(
                cluster.api,
                cluster.nodes.name(f"n{i}"),
                lambda n: n["metadata"]["labels"].get(lbl.TIER) == "shared",
                what=f"tiering service a: node n{i} in tier shared",
            )
        with b:
            # b is up and contending: it reads the lease and finds it held.
            assert wait_until(
                lambda: sum(1 for r in cluster.requests(users["b"]) if r.resource == "leases") >= 2,
                timeout_s=30,
            ), b.log()

            cluster.set_stability("n0", "unstable")
            waiting.node(
                cluster.api,
                cluster.nodes.name("n0"),
                lambda n: (
                    '"phase":"drained"'
                    in n["metadata"].get("annotations", {}).get("nodeagent.io/drain", "")
                ),
                what="tiering service a: node n0 drained",
            )
            cluster.wait_gone("job-0")
            writes = {"create", "update", "patch", "delete"}
            assert [r for r in cluster.requests(users["b"]) if r.verb in writes] == [], (
                "the standby wrote"
            )

            a.kill()  # no release: b must wait the lease out
            killed = time.monotonic()
            assert wait_until(lambda: holder() == "b", timeout_s=40), b.log()
            failover_s = time.monotonic() - killed
            assert failover_s < 15 + 2 + 5, f"failover took {failover_s:.1f}s"
            assert cluster.lease()["spec"]["leaseTransitions"] == 1

            cluster.set_stability("n1", "unstable")
            waiting.node(
                cluster.api,
                cluster.nodes.name("n1"),
                lambda n: n["spec"].get("unschedulable") is True,
                what="tiering service b: node n1 cordoned after the failover",
            )
            cluster.wait_gone("job-1")
            assert cluster.reasons("n0").count("DrainStarted") == 1, "b repeated a's drain"
            b.stop()  # SIGTERM: b gives the lease up for the next replica
            assert holder() == "", "the lease was not released on SIGTERM"

    # Discovery (non-resource URLs such as /apis) is every authenticated user's by default.
    asked = {
        (r.verb, r.resource)
        for user in users.values()
        for r in cluster.requests(user)
        if r.resource
    }
    granted = {
        (verb, resource)
        for role in kube_identities.tiering_manifests
        if role["kind"] in ("ClusterRole", "Role")
        for rule in role["rules"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    # The drains, tiers and leases of this scenario; the diagnosis and the Kueue flavors use the
    # rest of the role (tests/tiering/pending and tests/tiering/quota check those on this server).
    assert asked <= granted, f"asked but not granted {asked - granted}"
    assert {
        ("list", "nodes"), ("watch", "nodes"), ("patch", "nodes"), ("list", "pods"),
        ("create", "pods/eviction"), ("get", "leases"), ("create", "leases"),
        ("update", "leases"), ("create", "events"),
    } <= asked  # fmt: skip
    refused = [
        (r.verb, r.resource, r.code)
        for user in users.values()
        for r in cluster.requests(user)
        # Expected: no Lease or history ConfigMap yet (404), a lost race for the Lease (409).
        if r.code >= 400
        and (r.resource, r.code) not in {("leases", 404), ("leases", 409), ("configmaps", 404)}
    ]
    assert refused == [], "requests the API server refused"
