"""Health propagation: injected XID to the updated ListAndWatch message, median and p99.

Run: ``python bench/device_plugin_health.py [--rounds N]``. Path measured: simulator XID ->
NVML event set -> health model (the real one) -> plugin -> ListAndWatch at the test kubelet,
on dgx-h100 with the faulted GPU time-sliced into 4 replicas (all four must turn Unhealthy).
Baseline in the same run: a transition pushed straight from a HealthSource (no NVML, no model),
which isolates the plugin's own share. Target: under 100 ms for the plugin's share.
"""

from __future__ import annotations

import argparse
import time

from device_plugin_common import quantiles_ms, running, table

from nodeagent.config.health import HealthSection
from nodeagent.health.model import HealthModel
from nodeagent.runtime.health_source import HealthState
from nodeagent.sim.control import SimControl
from nodeagent.testing.events import pumping_events

TS4 = {
    "pools": {"default": {"sharing": {"mode": "time-slicing", "replicas": 4}}},
    "device_plugin": {"health_recovery_quiet_s": 0},
}


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def _replicas_are(bench, uuid: str, health: str):
    def check(devices) -> bool:
        return all(devices.get(f"{uuid}::{n}", ("",))[0] == health for n in range(4))

    return check


def end_to_end(rounds: int) -> list[float]:
    clock = Clock()
    model = HealthModel(HealthSection(fatal_hold_s=30.0, recovery_quiet_s=0.0), clock=clock)
    samples = []
    with running("dgx-h100", TS4, health=model) as bench:
        model.on_snapshot(bench.node.snapshot())
        kubelet = bench.kubelet
        control = SimControl(bench.state_dir)
        uuids = [g.info.uuid for g in bench.node.snapshot().gpus]
        with pumping_events(bench.node, model.on_event, poll_s=0.01):
            for i in range(rounds):
                gpu = i % 8
                kubelet.wait_devices("nvidia.com/gpu", _replicas_are(bench, uuids[gpu], "Healthy"))
                start = time.monotonic()
                control.inject("xid", gpu, code=79)
                kubelet.wait_devices(
                    "nvidia.com/gpu", _replicas_are(bench, uuids[gpu], "Unhealthy"), 5.0
                )
                samples.append(time.monotonic() - start)
                control.clear(gpu)
                clock.now += 31.0
                model.on_snapshot(bench.node.snapshot())
                model.tick()
    return samples


def plugin_only(rounds: int) -> list[float]:
    samples = []
    with running("dgx-h100", TS4) as bench:
        uuids = [g.info.uuid for g in bench.node.snapshot().gpus]
        for i in range(rounds):
            gpu = i % 8
            for state, want in ((HealthState.LOST, "Unhealthy"), (HealthState.HEALTHY, "Healthy")):
                start = time.monotonic()
                bench.health.set(uuids[gpu], state, "xid 79", index=gpu)
                bench.kubelet.wait_devices(
                    "nvidia.com/gpu", _replicas_are(bench, uuids[gpu], want), 5.0
                )
                if state is HealthState.LOST:
                    samples.append(time.monotonic() - start)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=100)
    args = parser.parse_args()
    rows = []
    for name, fn in (
        ("XID -> NVML event -> health model -> ListAndWatch", end_to_end),
        ("HealthSource transition -> ListAndWatch (baseline)", plugin_only),
    ):
        med, p99 = quantiles_ms(fn(args.rounds))
        rows.append((name, args.rounds, f"{med:.1f}", f"{p99:.1f}"))
    print(table(["path", "rounds", "median ms", "p99 ms"], rows))


if __name__ == "__main__":
    main()
