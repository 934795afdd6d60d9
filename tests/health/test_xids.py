"""The XID catalog: every XID of the reference notes, its category, action and state."""

from __future__ import annotations

import pytest

from nodeagent.health.xids import CATALOG, Action, XidCategory, XidPolicy, strongest
from nodeagent.runtime.health_source import HealthState

H = HealthState
C = XidCategory
A = Action

# Every XID named in the reference notes' XID table.
REFERENCE_XIDS = {13, 31, 43, 45, 46, 48, 62, 63, 64, 74, 79, 92, 94, 95, 109, 119, 120, 136,
                  140, 143, 144, 145, 146, 147, 148, 149, 150, 154, 155, 156, 158, 160}  # fmt: skip


def test_catalog_covers_every_reference_xid() -> None:
    assert not REFERENCE_XIDS - set(CATALOG), "XIDs missing from the catalog"


@pytest.mark.parametrize(
    ("code", "category", "action", "state"),
    [
        pytest.param(13, C.APPLICATION, A.RESTART_APP, H.HEALTHY, id="13 app exception"),
        pytest.param(31, C.APPLICATION, A.RESTART_APP, H.HEALTHY, id="31 page fault"),
        pytest.param(43, C.APPLICATION, A.NONE, H.HEALTHY, id="43 channel reset informational"),
        pytest.param(45, C.APPLICATION, A.RESTART_APP, H.DEGRADED, id="45 predictor degrades"),
        pytest.param(46, C.DRIVER_FIRMWARE, A.RESET_GPU, H.UNHEALTHY, id="46 timeout reset"),
        pytest.param(48, C.MEMORY, A.DRAIN_INVESTIGATE, H.UNHEALTHY, id="48 DBE drain"),
        pytest.param(62, C.DRIVER_FIRMWARE, A.RESET_GPU, H.UNHEALTHY, id="62 PMU halt"),
        pytest.param(63, C.MEMORY, A.NONE, H.DEGRADED, id="63 remap event"),
        pytest.param(64, C.MEMORY, A.RESET_GPU, H.UNHEALTHY, id="64 remap failure"),
        pytest.param(74, C.INTERCONNECT, A.DRAIN_INVESTIGATE, H.UNHEALTHY, id="74 nvlink"),
        pytest.param(79, C.FATAL_HARDWARE, A.REBOOT_NODE, H.LOST, id="79 off the bus"),
        pytest.param(92, C.MEMORY, A.NONE, H.DEGRADED, id="92 SBE interrupts"),
        pytest.param(94, C.MEMORY, A.RESTART_APP, H.HEALTHY, id="94 contained"),
        pytest.param(95, C.FATAL_HARDWARE, A.RESET_GPU, H.UNHEALTHY, id="95 uncontained"),
        pytest.param(109, C.DRIVER_FIRMWARE, A.RESET_GPU, H.UNHEALTHY, id="109 ctxsw"),
        pytest.param(119, C.DRIVER_FIRMWARE, A.RESET_GPU, H.UNHEALTHY, id="119 GSP RPC"),
        pytest.param(120, C.DRIVER_FIRMWARE, A.RESET_GPU, H.UNHEALTHY, id="120 GSP"),
        pytest.param(145, C.INTERCONNECT, A.DRAIN_INVESTIGATE, H.UNHEALTHY, id="145 nvlink5"),
        pytest.param(154, C.DRIVER_FIRMWARE, A.NONE, H.DEGRADED, id="154 recovery changed"),
        pytest.param(160, C.FATAL_HARDWARE, A.REBOOT_NODE, H.UNHEALTHY, id="160 channel retire"),
    ],
)
def test_catalog_rows(code: int, category: C, action: A, state: H) -> None:
    info = XidPolicy().lookup(code)
    assert info is not None
    assert (info.category, info.action, info.state) == (category, action, state)
    assert info.meaning


def test_unknown_xid_needs_a_look() -> None:
    info = XidPolicy().lookup(999)
    assert info is not None
    assert (info.category, info.state, info.action) == (C.UNKNOWN, H.UNHEALTHY, A.DRAIN_INVESTIGATE)


@pytest.mark.parametrize(
    ("policy", "code", "expected_state", "expected_action"),
    [
        pytest.param(XidPolicy(ignore=frozenset({79})), 79, None, None, id="ignored"),
        pytest.param(XidPolicy(fatal=frozenset({13})), 13, H.UNHEALTHY, A.RESET_GPU,
                     id="app XID made fatal gets a reset"),
        pytest.param(XidPolicy(fatal=frozenset({48})), 48, H.UNHEALTHY, A.DRAIN_INVESTIGATE,
                     id="already fatal keeps stronger action"),
        pytest.param(XidPolicy(fatal=frozenset({79})), 79, H.LOST, A.REBOOT_NODE,
                     id="lost is not downgraded"),
    ],
)  # fmt: skip
def test_operator_overrides(
    policy: XidPolicy, code: int, expected_state: H | None, expected_action: A | None
) -> None:
    info = policy.lookup(code)
    if expected_state is None:
        assert info is None
    else:
        assert info is not None
        assert (info.state, info.action) == (expected_state, expected_action)


def test_policy_rejects_xid_in_both_lists() -> None:
    with pytest.raises(ValueError, match="both ignored and fatal"):
        XidPolicy(ignore=frozenset({13}), fatal=frozenset({13}))


@pytest.mark.parametrize(
    ("code", "gpu_wide"),
    [
        pytest.param(13, False, id="app XID stays on the instance"),
        pytest.param(46, False, id="reset-class XID stays on the instance"),
        pytest.param(79, True, id="off the bus hits the GPU"),
        pytest.param(95, True, id="uncontained hits the GPU"),
        pytest.param(74, True, id="drain-class hits the GPU"),
    ],
)
def test_scope_of_mig_attributed_xids(code: int, gpu_wide: bool) -> None:
    policy = XidPolicy()
    info = policy.lookup(code)
    assert info is not None
    assert policy.scope_is_gpu(info) is gpu_wide


def test_strongest_action_order() -> None:
    assert strongest([A.NONE, A.RESET_GPU, A.RESTART_APP]) is A.RESET_GPU
    assert strongest([]) is A.NONE
