"""Health propagation to ListAndWatch, replicas and MIG siblings, recovery after quiet."""

from __future__ import annotations

import statistics
import time

import pytest

from nodeagent.config.health import HealthSection
from nodeagent.health.model import HealthModel
from nodeagent.runtime.health_source import HealthState
from nodeagent.sim.control import SimControl
from nodeagent.testing.clock import FakeClock
from nodeagent.testing.events import pumping_events
from nodeagent_device_plugin.withheld import HealthTracker

TS4 = {"mode": "time-slicing", "replicas": 4}


def _all(devices, ids, health):
    return all(devices.get(i, ("?",))[0] == health for i in ids)


def test_physical_fault_marks_every_replica_within_100ms(run_plugin) -> None:
    """Ten health changes, each measured from the change to the arrival (at the test kubelet)
    of the first list showing all four replicas in the new state. As in the end-to-end test
    below, the 100 ms is asserted on the median: one round on a loaded 2-core CI machine can
    lose the CPU for longer, but a path slow by design (a poll, a lost wake-up) is slow in most
    rounds. No round may take a second."""
    plugin = run_plugin("dgx-h100", config={"pools": {"default": {"gpu_sharing": {"3": TS4}}}})
    kubelet = plugin.kubelet
    replicas = [f"{plugin.uuid(3)}::{n}" for n in range(4)]
    kubelet.wait_devices("nvidia.com/gpu", lambda d: _all(d, replicas, "Healthy"))
    latencies = []
    for round_ in range(10):
        state = HealthState.UNHEALTHY if round_ % 2 == 0 else HealthState.HEALTHY
        if state is HealthState.HEALTHY:
            plugin.manager.health.quiet_s = 0  # the quiet period is test_recovery_waits_...'s
        want = "Unhealthy" if state is HealthState.UNHEALTHY else "Healthy"
        view = kubelet.plugins["nvidia.com/gpu"]
        before = len(view.lists)
        started = time.monotonic()
        plugin.health.set(plugin.uuid(3), state, "xid 79", index=3)
        kubelet.wait_devices("nvidia.com/gpu", lambda d, w=want: _all(d, replicas, w), 1.0)
        arrived = next(at for at, d in view.lists[before:] if _all(d, replicas, want))
        latencies.append(arrived - started)
        others = view.devices
        assert all(h == "Healthy" for i, (h, _) in others.items() if i not in replicas)
    assert statistics.median(latencies) < 0.1, latencies
    assert max(latencies) < 1.0, latencies


def test_gpu_fault_marks_its_mig_devices_and_a_mig_fault_only_itself(run_plugin) -> None:
    plugin = run_plugin(
        "dgx-a100",
        mig={2: ["3g.20gb", "3g.20gb"]},
        config={"device_plugin": {"mig_strategy": "mixed"}},
    )
    kubelet = plugin.kubelet
    migs = [i.uuid for i in plugin.snapshot.gpus[2].mig_instances]
    kubelet.wait_devices("nvidia.com/mig-3g.20gb", lambda d: _all(d, migs, "Healthy"))
    plugin.health.set(migs[0], HealthState.UNHEALTHY, "xid 94", index=2)
    devices = kubelet.wait_devices(
        "nvidia.com/mig-3g.20gb", lambda d: _all(d, [migs[0]], "Unhealthy")
    )
    assert devices[migs[1]][0] == "Healthy"
    plugin.health.set(plugin.uuid(2), HealthState.LOST, "xid 79", index=2)
    kubelet.wait_devices("nvidia.com/mig-3g.20gb", lambda d: _all(d, migs, "Unhealthy"))
    assert _all(kubelet.wait_devices("nvidia.com/gpu"), [plugin.uuid(0)], "Healthy")


def test_recovery_waits_for_the_quiet_period(run_plugin) -> None:
    plugin = run_plugin("t4", config={"device_plugin": {"health_recovery_quiet_s": 0.4}})
    kubelet = plugin.kubelet
    u = plugin.uuid(0)
    plugin.health.set(u, HealthState.UNHEALTHY, "xid 48")
    kubelet.wait_devices("nvidia.com/gpu", lambda d: _all(d, [u], "Unhealthy"))
    cleared = time.monotonic()
    plugin.health.set(u, HealthState.HEALTHY)
    kubelet.wait_devices("nvidia.com/gpu", lambda d: _all(d, [u], "Healthy"), 2.0)
    # Judged by when each list reached the kubelet, not by a sleep: the first list showing the
    # GPU healthy again arrived no sooner than the quiet period after the fault cleared.
    since = [(at, devices[u][0]) for at, devices in kubelet.plugins["nvidia.com/gpu"].lists]
    healthy_at = next(at for at, health in since if at >= cleared and health == "Healthy")
    assert healthy_at - cleared >= 0.4, since


@pytest.mark.parametrize(
    ("steps", "healthy_at_end"),
    [
        pytest.param([("bad", 0), ("good", 1), ("tick", 60.9)], False, id="still-quiet"),
        pytest.param([("bad", 0), ("good", 1), ("tick", 61)], True, id="recovered"),
        pytest.param(
            [("bad", 0), ("good", 1), ("bad", 30), ("good", 31), ("tick", 60)],
            False,
            id="relapse-restarts-quiet",
        ),
        pytest.param([("good", 0)], True, id="never-bad"),
        pytest.param([("degraded", 0)], True, id="degraded-is-schedulable"),
    ],
)
def test_tracker_quiet_period_with_fake_clock(steps, healthy_at_end) -> None:
    clock = FakeClock(start=100.0)
    changes = []
    tracker = HealthTracker(60.0, lambda: changes.append(clock.now), clock)
    state = {
        "bad": HealthState.UNHEALTHY,
        "good": HealthState.HEALTHY,
        "degraded": HealthState.DEGRADED,
    }
    for action, at in steps:
        clock.now = 100.0 + at
        if action == "tick":
            tracker.poll()
        else:
            tracker.set_state("GPU-x", state[action])
    assert (tracker.reason("GPU-x") is None) is healthy_at_end


def test_injected_xid_through_the_real_health_model(run_plugin, sim_state_dir) -> None:
    """End to end: simulator XID -> NVML event -> health model -> ListAndWatch, within 100 ms.

    One XID per GPU on seven time-sliced GPUs, each measured from the injection to the arrival
    (at the test kubelet) of the first list with all four replicas Unhealthy. The issue's 100 ms
    is asserted on the median: on a loaded 2-core CI machine one round can lose the CPU for
    longer than that, but a path that is slow by design (a poll period, a lost wake-up falling
    back to a timeout) is slow in most rounds and fails the median. Every round must still stay
    under a generous bound, so a single hang is caught too. A round normally takes ~5 ms (see
    docs/benchmarks.md).
    """
    plugin = run_plugin(
        "dgx-h100",
        config={
            "pools": {"default": {"sharing": TS4}},
            "device_plugin": {"health_recovery_quiet_s": 0.2},
        },
    )
    clock = FakeClock(start=100.0)
    clock.now = time.time()
    model = HealthModel(HealthSection(fatal_hold_s=30.0, recovery_quiet_s=0.0), clock=clock)
    model.on_snapshot(plugin.node.snapshot())
    plugin.manager.health.attach(model)
    kubelet = plugin.kubelet
    view = kubelet.plugins

    def replicas(gpu: int) -> list[str]:
        return [f"{plugin.uuid(gpu)}::{n}" for n in range(4)]

    everything = [r for gpu in range(8) for r in replicas(gpu)]
    kubelet.wait_devices("nvidia.com/gpu", lambda d: _all(d, everything, "Healthy"))
    control = SimControl(sim_state_dir)
    faulted = range(1, 8)
    latencies = []
    with pumping_events(plugin.node, model.on_event):
        for gpu in faulted:
            before = len(view["nvidia.com/gpu"].lists)
            started = time.monotonic()
            control.inject("xid", gpu, code=79)
            kubelet.wait_devices(
                "nvidia.com/gpu", lambda d, g=gpu: _all(d, replicas(g), "Unhealthy"), 2.0
            )
            arrived = next(
                at
                for at, devices in view["nvidia.com/gpu"].lists[before:]
                if _all(devices, replicas(gpu), "Unhealthy")
            )
            latencies.append(arrived - started)
            # Only the faulted GPU's replicas: the ones not yet injected stay Healthy.
            devices = view["nvidia.com/gpu"].devices
            assert _all(devices, [r for g in range(gpu + 1, 8) for r in replicas(g)], "Healthy")
            assert _all(devices, replicas(0), "Healthy")
        assert statistics.median(latencies) < 0.1, latencies
        assert max(latencies) < 1.0, latencies

        for gpu in faulted:
            control.clear(gpu)
        clock.now += 31.0  # past the model's hold time for the faults
        model.on_snapshot(plugin.node.snapshot())
        cleared = time.monotonic()
        model.tick()
        kubelet.wait_devices("nvidia.com/gpu", lambda d: _all(d, everything, "Healthy"), 2.0)
        assert time.monotonic() - cleared >= 0.2  # the plugin's quiet period
