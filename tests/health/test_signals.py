"""Every health signal through the simulator's fault injection -> state, reason and action.

Each row injects faults into GPU 0 of a simulated node the way an operator would (``SimControl``,
what ``nodeagent sim inject`` calls), feeds the queued events and one snapshot to the health
model, and checks what the model says about GPU 0 and that GPU 1 is untouched. The same rows
(a subset) are checked again in the node condition on a real kube-apiserver in test_kube.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from nodeagent.runtime.health_source import HealthState
from nodeagent.sim.presets import DRIVER_VERSION
from tests.health.conftest import MakeRig, Rig

H = HealthState


@dataclass(frozen=True)
class Fault:
    """One signal: what to inject into GPU 0 and what the model must say."""

    kind: str
    state: H
    reason: str | None  # a substring of one of GPU 0's reasons; None: no reasons at all
    action: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    times: int = 1  # injections (an SBE storm is many single-bit errors)
    preset: str = "dgx-h100"
    config: dict[str, Any] = field(default_factory=dict)


def inject(rig: Rig, fault: Fault, gpu: int = 0) -> None:
    """Inject ``fault`` into ``gpu`` and let the model see it."""
    for _ in range(fault.times):
        rig.control.inject(fault.kind, gpu, **fault.kwargs)
    rig.pump()


def xid(code: int, state: H, reason: str, action: str) -> Any:
    return pytest.param(Fault("xid", state, reason, action, {"code": code}), id=f"xid-{code}")


SIGNALS = [
    # XIDs, one or more per catalog category.
    xid(13, H.HEALTHY, "xid 13: graphics engine exception", "restart the application"),
    xid(43, H.HEALTHY, "xid 43: GPU stopped processing", "none"),
    xid(45, H.DEGRADED, "xid 45: preemptive cleanup", "restart the application"),
    xid(94, H.HEALTHY, "xid 94: contained ECC error", "restart the application"),  # memory
    xid(92, H.DEGRADED, "xid 92: high single-bit ECC error rate", "none"),  # memory
    xid(63, H.DEGRADED, "xid 63: row remap pending", "none"),  # memory
    xid(74, H.UNHEALTHY, "xid 74: NVLink error", "drain and investigate"),  # interconnect
    xid(136, H.UNHEALTHY, "xid 136: NVLink link training failure", "reset the GPU"),
    xid(46, H.UNHEALTHY, "xid 46: GPU stopped responding", "reset the GPU"),  # driver/firmware
    xid(119, H.UNHEALTHY, "xid 119: GSP RPC timeout", "reset the GPU"),
    xid(154, H.DEGRADED, "xid 154: GPU recovery action changed", "none"),
    xid(95, H.UNHEALTHY, "xid 95: uncontained ECC error", "reset the GPU"),  # fatal hardware
    xid(79, H.LOST, "xid 79: GPU has fallen off the bus", "reboot the node"),
    xid(160, H.UNHEALTHY, "xid 160: channel retirement event", "reboot the node"),
    xid(999, H.UNHEALTHY, "not in the catalog", "drain and investigate"),
    # ECC and memory.
    pytest.param(Fault("ecc-sbe", H.HEALTHY, None, "none", config={"ecc_sbe_threshold": 5}),
                 id="ecc-sbe-single"),
    pytest.param(Fault("ecc-sbe", H.DEGRADED, "5 corrected ECC errors in 60s", "none", times=5,
                       config={"ecc_sbe_threshold": 5}), id="ecc-sbe-storm"),
    pytest.param(Fault("ecc-dbe", H.UNHEALTHY, "uncorrectable ECC errors: +1",
                       "drain and investigate"), id="ecc-dbe"),  # XID 48 rides along: drain
    pytest.param(Fault("remap-pending", H.UNHEALTHY, "row remap pending (takes effect",
                       "reset the GPU"), id="remap-pending"),
    pytest.param(Fault("remap-failure", H.UNHEALTHY, "row remapping failed",
                       "drain and investigate"), id="remap-failure"),
    pytest.param(Fault("ecc-dbe", H.UNHEALTHY, "retired pages pending", "drain and investigate",
                       preset="t4"), id="retired-pages-pending"),
    # Clocks, temperature and power.
    pytest.param(Fault("thermal", H.DEGRADED, "hardware thermal slowdown", "none"), id="thermal"),
    pytest.param(Fault("thermal", H.DEGRADED, "at or above the slowdown threshold", "none"),
                 id="thermal-temperature"),
    pytest.param(Fault("power-brake", H.DEGRADED,
                       "hardware slowdown, hardware power brake slowdown", "none"),
                 id="power-brake"),
    # Running into the SW power cap is normal operation under load: nothing to report.
    pytest.param(Fault("power-cap", H.HEALTHY, None, "none"), id="power-cap"),
    # Interconnects.
    pytest.param(Fault("pcie-replay", H.DEGRADED, "100 PCIe replays in the last minute",
                       "drain and investigate"), id="pcie-replay"),
    pytest.param(Fault("pcie-replay", H.HEALTHY, None, "none", {"count": 59}),
                 id="pcie-replay-below-threshold"),
    pytest.param(Fault("nvlink-down", H.UNHEALTHY, "NVLink down: link 3", "drain and investigate",
                       {"code": 3}), id="nvlink-down"),  # XID 74 rides along: drain
    pytest.param(Fault("nvlink-errors", H.DEGRADED, "201 NVLink errors in the last minute",
                       "drain and investigate", {"code": 7}), id="nvlink-errors"),
    pytest.param(Fault("nvlink-errors", H.HEALTHY, None, "none", {"count": 40}),
                 id="nvlink-errors-below-threshold"),  # 40 + 40 + 1 < 100
    # NVML itself.
    pytest.param(Fault("nvml-error", H.DEGRADED,
                       "NVML error: nvmlDeviceGetPowerUsage on GPU 0 failed: Timeout",
                       "drain and investigate"), id="nvml-error"),
    pytest.param(Fault("nvml-error", H.DEGRADED, "nvmlDeviceGetTotalEccErrors on GPU 0 failed",
                       "drain and investigate",
                       {"function": "nvmlDeviceGetTotalEccErrors", "code": 11}),
                 id="nvml-error-irq-on-ecc"),
    # UNKNOWN from a call on one GPU's handle is the GPU layer's sign of a GPU that stopped
    # answering (it comes before GPU_IS_LOST), so it reads as lost.
    pytest.param(Fault("nvml-error", H.LOST, "GPU lost: nvmlDeviceGetPowerUsage on GPU 0",
                       "reboot the node", {"code": 999}), id="nvml-error-unknown-is-lost"),
    pytest.param(Fault("lost", H.LOST, "GPU lost:", "reboot the node"), id="lost"),
    # Driver.
    pytest.param(Fault("driver", H.DEGRADED,
                       f"driver 580.65.06 differs from the pool's expected {DRIVER_VERSION}",
                       "drain and investigate", {"version": "580.65.06"},
                       config={"expected_driver": DRIVER_VERSION}), id="driver-vs-expected"),
    pytest.param(Fault("driver", H.HEALTHY, None, "none", {"version": "580.65.06"}),
                 id="driver-changed-without-expectation"),
]  # fmt: skip


@pytest.mark.parametrize("fault", SIGNALS)
def test_signal(make_rig: MakeRig, fault: Fault) -> None:
    rig = make_rig(fault.preset, **fault.config)
    assert rig.gpu(0).state is H.HEALTHY
    inject(rig, fault)
    health = rig.gpu(0)
    assert health.state is fault.state, health.reasons
    if fault.reason is None:
        assert health.reasons == ()
    else:
        assert any(fault.reason in r for r in health.reasons), health.reasons
    assert health.action == fault.action
    if len(rig.uuids) > 1 and fault.kind != "driver":  # the driver is the whole node's
        assert rig.gpu(1).state is H.HEALTHY
        assert rig.gpu(1).reasons == ()


def test_driver_vs_expected_marks_every_gpu(make_rig: MakeRig) -> None:
    rig = make_rig("dgx-h100", expected_driver=DRIVER_VERSION)
    rig.control.inject("driver", 0, version="580.65.06")
    rig.pump()
    assert {rig.gpu(i).state for i in range(8)} == {H.DEGRADED}
    assert rig.model.node_health().driver_version == "580.65.06"


def test_no_per_gpu_driver_comparison(make_rig: MakeRig) -> None:
    # NVML reports one driver per host: a GPU whose sample failed (its facts are the last
    # ones read) must not be reported as running another driver after a driver change.
    rig = make_rig("dgx-h100")
    # A failing call of the GPU's info read (not a telemetry reading) leaves GPU 2 with the
    # facts read last, the old driver among them.
    rig.control.inject("nvml-error", 2, function="nvmlDeviceGetMigMode", code=10)
    rig.control.inject("driver", 0, version="580.65.06")
    rig.pump()
    snapshot = rig.node.snapshot()
    stale = snapshot.gpus[2]
    assert (stale.lost, stale.info.driver_version) == (False, DRIVER_VERSION), stale
    assert snapshot.driver_version == "580.65.06"
    assert rig.gpu(2).state is H.DEGRADED  # for the NVML error only
    reasons = [r for i in range(8) for r in rig.gpu(i).reasons]
    assert not [r for r in reasons if "driver" in r], reasons


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(Fault("pcie-replay", H.DEGRADED, "PCIe replays", "drain and investigate"),
                     id="pcie-replay"),
        pytest.param(Fault("nvlink-errors", H.DEGRADED, "NVLink errors", "drain and investigate"),
                     id="nvlink-errors"),
    ],
)  # fmt: skip
def test_counter_faults_clear_after_the_window_and_quiet_period(
    make_rig: MakeRig, fault: Fault
) -> None:
    # Counters never go down: the condition ends when they stop growing for a minute, then the
    # quiet period must pass.
    rig = make_rig("dgx-h100", recovery_quiet_s=120)
    inject(rig, fault)
    assert rig.gpu(0).state is H.DEGRADED
    rig.clock.advance(61)
    rig.pump()  # no growth in the last minute: not observed any more
    assert rig.gpu(0).state is H.DEGRADED
    rig.clock.advance(121)
    rig.pump()
    assert rig.gpu(0).state is H.HEALTHY


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(Fault("power-brake", H.DEGRADED, "power brake", "none"), id="power-brake"),
        pytest.param(Fault("nvml-error", H.DEGRADED, "NVML error", "drain and investigate"),
                     id="nvml-error"),
    ],
)  # fmt: skip
def test_clear_ends_state_faults(make_rig: MakeRig, fault: Fault) -> None:
    rig = make_rig("dgx-h100", recovery_quiet_s=30)
    inject(rig, fault)
    assert rig.gpu(0).state is fault.state
    rig.control.clear(0)
    rig.clock.advance(31)
    rig.pump()
    rig.clock.advance(31)
    rig.pump()
    assert rig.gpu(0).state is H.HEALTHY
