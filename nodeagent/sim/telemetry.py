"""Telemetry of a simulated GPU as closed-form functions of time.

Nothing here writes state: utilization, power, temperature and clocks are smooth functions of
the wall clock (a slow sine with a per-GPU phase and period derived from the UUID) plus the load
of the processes attached to the GPU. Energy is the exact integral of that power curve since the
GPU's last checkpoint, so it is monotonic and consistent with the power readings. A checkpoint
is written only when the load changes (a process is added or removed, or the GPU is reset).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

import pynvml

from nodeagent.sim import models

FULL_GPU_LOAD = 0.8  # utilization share of a process that owns a whole GPU (0..1)
# Memory an idle GPU shows as used beside the reserved memory (nvidia-smi -q "Used: 1 MiB" on an
# idle H200, driver 550.90.12; 0-2 MiB on H100 outputs).
IDLE_MEMORY_MIB = 1
IDLE_SM_CLOCK_MHZ = 210
# Memory-controller busy time per unit of SM busy time (a compute-bound mix).
MEMORY_BUSY_PER_SM = 0.6  # SM clock of an idle datacenter GPU

# Power faults. Under the SW power cap the board holds its draw just under the enforced limit and
# the clocks drop to stay there. The HW power brake (an external signal, e.g. from the power
# supply) cuts the clocks by half or more, and the draw falls with them.
POWER_CAP_FRACTION = 0.99  # draw / enforced limit while capped
POWER_CAP_CLOCK = 0.8  # SM clock / max while capped
POWER_BRAKE_FRACTION = 0.35  # draw / enforced limit while braked
POWER_BRAKE_CLOCK = 0.4  # SM clock / max while braked


@dataclass(frozen=True, slots=True)
class Wave:
    """A GPU's private sine: angular frequency (rad/s) and phase (rad)."""

    omega: float
    phase: float


_WAVES: dict[str, Wave] = {}


def wave(uuid: str) -> Wave:
    """The per-GPU wave, seeded from the UUID so it is the same in every process."""
    cached = _WAVES.get(uuid)
    if cached is None:
        digest = hashlib.sha256(uuid.encode()).digest()
        period_s = 180.0 + digest[0] % 120  # three to five minutes
        phase = digest[1] / 256.0 * 2.0 * math.pi
        cached = _WAVES[uuid] = Wave(2.0 * math.pi / period_s, phase)
    return cached


def _demand(gpu: dict[str, Any], model: models.GpuModel, proc: dict[str, Any]) -> float:
    """What a process asks of the whole GPU (0..1): its own share, or a share of its MIG slice."""
    if proc.get("load") is not None:
        return float(proc["load"])
    share = FULL_GPU_LOAD
    if proc["gi"] is not None:
        profile = _gi_profile(gpu, model, proc["gi"])
        if profile is not None:
            share *= profile.compute_slices / model.max_mig_devices
    return share


# Loads by the identity of the process list they were computed from. The simulated driver
# hands every reading of one GPU the same read-only list for as long as the state is unchanged
# (a pass asks for the load about six times per GPU); the entry keeps the list alive, so its
# identity cannot be reused by another list while cached.
_LOADS: dict[int, tuple[list[dict[str, Any]], float]] = {}
_LOADS_KEPT = 256


def load(gpu: dict[str, Any], procs: list[dict[str, Any]]) -> float:
    """The GPU's load (0..1): what its processes ask for, up to all of it."""
    if not procs:
        return 0.0
    cached = _LOADS.get(id(procs))
    if cached is not None and cached[0] is procs:
        return cached[1]
    model = models.MODELS[gpu["model"]]
    value = min(1.0, sum(_demand(gpu, model, p) for p in procs))
    if len(_LOADS) >= _LOADS_KEPT:
        _LOADS.clear()
    _LOADS[id(procs)] = (procs, value)
    return value


def _swing(gpu: dict[str, Any], now: float) -> float:
    """The slow wave the busy readings follow: 0.8..1.0 of what the load asks."""
    w = wave(gpu["uuid"])
    return 0.9 + 0.1 * math.sin(w.omega * now + w.phase)


def process_busy(gpu: dict[str, Any], procs: list[dict[str, Any]], now: float) -> dict[int, float]:
    """Each process's busy share of the GPU's time right now (0..1, by PID).

    A process's demand swings 0.8..1.0 with the GPU's slow wave; when the demands add up to
    more than the whole GPU, each gets its part of it in proportion (the GPU reads 100 %).
    """
    swing = _swing(gpu, now)
    model = models.MODELS[gpu["model"]]
    busy = {int(p["pid"]): _demand(gpu, model, p) * swing for p in procs}
    total = sum(busy.values())
    scale = 1.0 / total if total > 1.0 else 1.0
    return {pid: share * scale for pid, share in busy.items()}


def process_utilization(
    gpu: dict[str, Any], procs: list[dict[str, Any]], now: float
) -> dict[int, tuple[int, int]]:
    """(SM %, memory %) of each process that ran in the last sample, by PID.

    They add up to the GPU-wide :func:`utilization` (rounding apart); a process that asked for
    no time has no sample, as NVML leaves idle processes out.
    """
    out: dict[int, tuple[int, int]] = {}
    for pid, share in process_busy(gpu, procs, now).items():
        if share <= 0.0:
            continue
        sm = 100.0 * share
        out[pid] = (round(sm), round(sm * MEMORY_BUSY_PER_SM))
    return out


def _gi_profile(gpu: dict[str, Any], model: models.GpuModel, gi_id: int) -> models.GiProfile | None:
    for gi in gpu["instances"]:
        if gi["id"] == gi_id:
            return model.profile_by_id(gi["profile_id"])
    return None


def _power_terms(model: models.GpuModel, level: float) -> tuple[float, float]:
    """Mean and amplitude (W) of the power curve at load ``level``; mean > amplitude always."""
    mean = model.idle_power_w + (0.85 * model.power_limit_w - model.idle_power_w) * level
    amplitude = 0.02 * model.power_limit_w + 0.08 * model.power_limit_w * level
    return mean, min(amplitude, 0.5 * mean)


def _fault_power_w(gpu: dict[str, Any], model: models.GpuModel) -> float | None:
    """The constant draw a power fault holds the GPU at, or ``None`` without one."""
    mode = gpu["faults"].get("power")
    if mode == "cap":
        return POWER_CAP_FRACTION * model.power_limit_w
    if mode == "brake":
        return POWER_BRAKE_FRACTION * model.power_limit_w
    return None


def power_w(gpu: dict[str, Any], procs: list[dict[str, Any]], now: float) -> float:
    """Power draw in watts at time ``now``."""
    model = models.MODELS[gpu["model"]]
    held = _fault_power_w(gpu, model)
    if held is not None:
        return held
    w = wave(gpu["uuid"])
    mean, amplitude = _power_terms(model, load(gpu, procs))
    return mean + amplitude * math.sin(w.omega * now + w.phase)


def energy_mj(gpu: dict[str, Any], procs: list[dict[str, Any]], now: float) -> int:
    """Energy in millijoules since driver load: the checkpoint plus the integral of power."""
    model = models.MODELS[gpu["model"]]
    w = wave(gpu["uuid"])
    t0 = float(gpu["energy"]["t"])
    base = int(gpu["energy"]["mj"])
    if now <= t0:
        return base
    held = _fault_power_w(gpu, model)
    if held is not None:
        # Constant draw since the checkpoint (written when the power fault began).
        return base + int(held * (now - t0) * 1000.0)
    mean, amplitude = _power_terms(model, load(gpu, procs))
    joules = mean * (now - t0) - amplitude / w.omega * (
        math.cos(w.omega * now + w.phase) - math.cos(w.omega * t0 + w.phase)
    )
    return base + int(joules * 1000.0)


def utilization(gpu: dict[str, Any], procs: list[dict[str, Any]], now: float) -> tuple[int, int]:
    """(GPU %, memory %) utilization; 0 when idle."""
    gpu_pct = 100.0 * sum(process_busy(gpu, procs, now).values())
    return round(gpu_pct), round(gpu_pct * MEMORY_BUSY_PER_SM)


def temperature_c(gpu: dict[str, Any], procs: list[dict[str, Any]], now: float) -> int:
    """GPU temperature in Celsius: follows power; above slowdown under a thermal fault."""
    model = models.MODELS[gpu["model"]]
    if gpu["faults"]["thermal"]:
        # Past the slowdown threshold, short of shutdown (3 C apart on Hopper).
        return min(model.slowdown_c + 3, model.shutdown_c - 1)
    span = model.power_limit_w - model.idle_power_w
    heat = (power_w(gpu, procs, now) - model.idle_power_w) / span
    idle_c = 30 + int(wave(gpu["uuid"]).phase) % 5
    return round(idle_c + 45.0 * max(0.0, heat))


def clocks_mhz(gpu: dict[str, Any], procs: list[dict[str, Any]], now: float) -> tuple[int, int]:
    """(SM clock, memory clock) in MHz."""
    model = models.MODELS[gpu["model"]]
    level = load(gpu, procs)
    power = gpu["faults"].get("power")
    if gpu["faults"]["thermal"] or power:
        cut = 1.0
        if gpu["faults"]["thermal"]:
            cut = 0.6
        if power == "cap":
            cut = min(cut, POWER_CAP_CLOCK)
        elif power == "brake":
            cut = min(cut, POWER_BRAKE_CLOCK)
        sm = int(model.max_sm_clock_mhz * cut)
    elif level <= 0.0:
        sm = IDLE_SM_CLOCK_MHZ
    else:
        w = wave(gpu["uuid"])
        sm = int(model.max_sm_clock_mhz * (0.97 + 0.03 * math.sin(w.omega * now + w.phase)))
    return sm, model.max_mem_clock_mhz


def clock_event_reasons(gpu: dict[str, Any], procs: list[dict[str, Any]]) -> int:
    """NVML clock-event reason bitmask."""
    reasons = 0
    if gpu["faults"]["thermal"]:
        reasons |= (
            pynvml.nvmlClocksEventReasonHwSlowdown | pynvml.nvmlClocksEventReasonHwThermalSlowdown
        )
    power = gpu["faults"].get("power")
    if power == "cap":
        reasons |= pynvml.nvmlClocksEventReasonSwPowerCap
    elif power == "brake":
        # NVML sets HW slowdown whenever the power brake is asserted, beside the brake bit.
        reasons |= (
            pynvml.nvmlClocksEventReasonHwSlowdown
            | pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
        )
    if reasons:
        return int(reasons)
    if load(gpu, procs) <= 0.0:
        return int(pynvml.nvmlClocksEventReasonGpuIdle)
    return int(pynvml.nvmlClocksEventReasonNone)
