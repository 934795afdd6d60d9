"""The canary probe: a short operator-given command on each shared device, its latency kept.

Off by default (``metrics.probe``). Each round runs the command once per device that several
workloads share (the renderer's last view), one after another, with ``CUDA_VISIBLE_DEVICES``
set to the device's UUID, so the probe competes for the GPU as the workloads do. A round never
runs on the render or scrape path; the renderer reads the last results.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field

from nodeagent.config.metrics import ProbeSection
from nodeagent.workloads import Device

log = logging.getLogger(__name__)

OUTPUT_TAIL_BYTES = 2048


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """One run on one device."""

    device: Device
    ok: bool
    duration_s: float
    finished_s: float
    detail: str  # exit status or timeout, and the output's tail


@dataclass(eq=False)
class ProbeRunner:
    """Runs the probe on the devices ``targets()`` names, every ``interval_s``."""

    section: ProbeSection
    targets: Callable[[], Sequence[Device]]
    _: KW_ONLY
    clock: Callable[[], float] = time.time
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _results: dict[Device, ProbeResult] = field(default_factory=dict, init=False)
    _failures: dict[Device, int] = field(default_factory=dict, init=False)

    def results(self) -> Mapping[Device, ProbeResult]:
        """The last result per device."""
        with self._lock:
            return dict(self._results)

    def failures(self) -> Mapping[Device, int]:
        """Failed runs per device since the agent started."""
        with self._lock:
            return dict(self._failures)

    def run_one(self, device: Device) -> ProbeResult:
        """Run the command on ``device`` once and record the result."""
        env = {
            **os.environ,
            "CUDA_VISIBLE_DEVICES": device.uuid,
            "NODEAGENT_PROBE_GPU": str(device.gpu_index),
        }
        started = time.perf_counter()
        try:
            done = subprocess.run(
                list(self.section.command),
                env=env,
                capture_output=True,
                timeout=self.section.timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            ok, detail = False, f"timed out after {self.section.timeout_s:g}s"
        except OSError as exc:
            ok, detail = False, f"could not start: {exc}"
        else:
            tail = (done.stdout + done.stderr)[-OUTPUT_TAIL_BYTES:].decode(errors="replace")
            ok, detail = done.returncode == 0, f"exit {done.returncode}: {tail.strip()}"
        duration = time.perf_counter() - started
        result = ProbeResult(device, ok, duration, self.clock(), detail)
        with self._lock:
            self._results[device] = result
            if not ok:
                self._failures[device] = self._failures.get(device, 0) + 1
        if not ok:
            log.warning("probe on GPU %d (%s) failed: %s", device.gpu_index, device.uuid, detail)
        return result

    def round(self) -> list[ProbeResult]:
        """One run per current target; results of devices no longer shared are dropped."""
        targets = list(self.targets())
        out = [self.run_one(d) for d in targets]
        with self._lock:
            for gone in [d for d in self._results if d not in targets]:
                del self._results[gone]
        return out

    def run(self, stop: threading.Event) -> None:
        """Rounds until ``stop`` is set."""
        while not stop.wait(self.section.interval_s):
            self.round()
