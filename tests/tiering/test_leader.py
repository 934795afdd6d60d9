"""Leader election over a Lease: one actor at a time, failover within the lease duration."""

from __future__ import annotations

import json

import pytest

from nodeagent import labels as lbl
from nodeagent_tiering.kube import KubeError
from nodeagent_tiering.leader import BREAKER_ANNOTATION, breaker_from_lease, reset_breaker_on_lease
from tests.support.kubeapi import make_pod
from tests.tiering.conftest import add_nodes, gpu_labels

T4 = gpu_labels("Tesla-T4", count=1, nvlink=1)


def lease(api):
    return api.get("leases", "nodeagent-tiering", "nodeagent")


def test_only_the_leader_acts_and_failover_happens_within_the_lease(api, make_controller, clock):
    add_nodes(api, {f"n{i}": T4 for i in range(4)})
    api.put("pods", make_pod("job", "n0"))
    a = make_controller(elect=True, identity="a")
    b = make_controller(elect=True, identity="b")
    assert a.elector.try_acquire_or_renew()
    assert not b.elector.try_acquire_or_renew(), "the lease is held"
    a.reconcile_once()
    b.reconcile_once()
    tier_patches = api.requests_matching("PATCH", "/nodes/")
    assert len(tier_patches) == 4, "only the leader labels the nodes"

    api.patch_direct("nodes", "n0", {"metadata": {"labels": {lbl.STABILITY: "unstable"}}})
    a.cache.relist()
    b.cache.relist()
    a.reconcile_once()  # a cordons n0, then dies before evicting
    assert api.get("nodes", "n0")["spec"]["unschedulable"] is True

    # a stops renewing. b must not take over before the lease duration has passed, and a must
    # stop acting (renew deadline 10 s) before b may start (lease 15 s).
    clock.advance(10)
    assert not a.may_act()
    assert not b.elector.try_acquire_or_renew()
    clock.advance(5)
    assert b.elector.try_acquire_or_renew()
    assert lease(api)["spec"]["holderIdentity"] == "b"
    assert lease(api)["spec"]["leaseTransitions"] == 1
    b.cache.relist()
    b.reconcile_once()
    a.cache.relist()
    a.reconcile_once()  # the old leader wakes up: it must not act
    starts = [e for e in api.list("events") if e["reason"] == "DrainStarted"]
    assert len(starts) == 1, "the drain was started once"
    assert len(api.requests_matching("POST", "/pods/job/eviction$")) == 1
    assert api.get("pods", "job", "default") is None, "the new leader finished the drain"


def test_stale_write_to_the_lease_is_refused(api, make_controller, clock):
    a = make_controller(elect=True, identity="a")
    b = make_controller(elect=True, identity="b")
    assert a.elector.try_acquire_or_renew()
    clock.advance(16)
    # b has never seen the lease change: expiry counts from its own first observation.
    assert not b.elector.try_acquire_or_renew()
    clock.advance(16)
    # Both see an expired lease; the one that writes second holds a stale resourceVersion.
    stale = json.loads(json.dumps(lease(api)))
    assert b.elector.try_acquire_or_renew()
    stale["spec"]["holderIdentity"] = "a"
    with pytest.raises(KubeError) as refused:
        a.kube.replace_lease("nodeagent", "nodeagent-tiering", stale)
    assert refused.value.status == 409
    assert lease(api)["spec"]["holderIdentity"] == "b"


def test_breaker_trips_is_persisted_on_the_lease_and_needs_a_reset(api, make_controller, clock):
    add_nodes(api, {f"n{i}": T4 for i in range(6)})
    ctl = make_controller(elect=True, identity="a")
    assert ctl.elector.try_acquire_or_renew()
    ctl.reconcile_once()
    for i in range(4):
        api.patch_direct("nodes", f"n{i}", {"metadata": {"labels": {lbl.STABILITY: "unstable"}}})
    ctl.cache.relist()
    result = ctl.reconcile_once()
    assert result.tripped
    assert breaker_from_lease(lease(api)).open
    assert "CircuitBreakerOpen" in [e["reason"] for e in api.list("events")]
    assert ctl.metrics.registry.get_sample_value("nodeagent_tiering_circuit_breaker_open") == 1
    assert not any(n["spec"].get("unschedulable") for n in api.list("nodes"))

    # A new leader inherits the open breaker.
    other = make_controller(elect=True, identity="b")
    assert not other.elector.try_acquire_or_renew()
    clock.advance(20)
    assert other.elector.try_acquire_or_renew()
    other.reconcile_once()
    assert other.breaker.open
    assert not any(n["spec"].get("unschedulable") for n in api.list("nodes"))

    # The operator resets it (what `nodeagent tiering reset-breaker` writes).
    reset_breaker_on_lease(other.kube, "nodeagent", "nodeagent-tiering", now_s=clock())
    clock.advance(1)
    other.elector.try_acquire_or_renew()
    other.elector.try_acquire_or_renew()
    other.reconcile_once()
    assert not other.breaker.open
    assert json.loads(lease(api)["metadata"]["annotations"][BREAKER_ANNOTATION])["state"] == (
        "closed"
    )
    assert sum(1 for n in api.list("nodes") if n["spec"].get("unschedulable")) == 2, (
        "drains resume within the cluster budget of 2"
    )
