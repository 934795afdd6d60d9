"""State transitions of the simulated node: MIG, processes, resets and faults.

Every function works on a state dict (see :mod:`nodeagent.sim.state`) inside a locked
``StateStore.mutate`` and raises ``pynvml.NVMLError(code)`` with the code the driver would
return, so the NVML surface and the control API share one set of rules.

GPU-instance placement without an explicit placement (``nvmlDeviceCreateGpuInstance``) follows
the rule in :func:`default_start`, which reproduces the examples in NVIDIA's MIG user guide and
public ``nvidia-smi mig -lgi`` outputs: the upper half of the memory slices fills first (the
profile's last legal slot there, then the others from the bottom up), then the lower half from
the bottom up. That keeps 0:4, the one place a 4g fits, free the longest.

Two driver behaviours that the agent depends on are switchable per node
(:data:`SEMANTICS`, ``SimControl.set_semantics``); see docs/simulator.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypedDict, Unpack

import pynvml

from nodeagent.sim import models, presets, telemetry
from nodeagent.sim.state import State, append_event

Gpu = dict[str, Any]
NO_ID = 0xFFFFFFFF  # what NVML reports for gpuInstanceId/computeInstanceId outside MIG

# XIDs the simulator emits alongside faults (NVIDIA XID catalog).
XID_DBE = 48  # double-bit ECC error
XID_REMAP_PENDING = 63  # row-remapping event recorded
XID_REMAP_FAILURE = 64  # row-remapping failure
XID_NVLINK = 74  # NVLink error
XID_FALLEN_OFF_BUS = 79  # GPU has fallen off the bus

# Default bursts of the counter faults: one injection is enough to cross the health checks'
# default per-minute thresholds (60 PCIe replays, 100 NVLink errors).
PCIE_REPLAY_BURST = 100
NVLINK_ERROR_BURST = 100
# nvml-error defaults: a persistent TIMEOUT from the power reading. The GPU layer reads TIMEOUT as
# a failed call (not a lost GPU), unlike UNKNOWN or GPU_IS_LOST on a GPU's handle.
NVML_ERROR_FUNCTION = "nvmlDeviceGetPowerUsage"
NVML_ERROR_CODE = int(pynvml.NVML_ERROR_TIMEOUT)

FAULT_KINDS = (
    "xid",
    "ecc-sbe",
    "ecc-dbe",
    "remap-pending",
    "remap-failure",
    "thermal",
    "nvlink-down",
    "lost",
    "driver",
    "pcie-replay",
    "nvlink-errors",
    "power-cap",
    "power-brake",
    "nvml-error",
)

# Driver behaviours nodeagent must handle either way, switchable per node; the defaults are what
# current drivers do (docs/simulator.md, "Semantics").
SEMANTICS: dict[str, bool] = {
    # nvmlDeviceSetMigMode takes effect at once on an idle GPU: Hopper and newer need no reset,
    # and Ampere's driver resets the GPU itself when it can (MIG User Guide, "GPU Reset on
    # Hopper+"; nvml.h nvmlDeviceSetMigMode). Off: the mode stays pending until a GPU reset.
    "mig_mode_applies_at_once": True,
    # nvmlDeviceGetGpuInstanceProfileInfo* answer NOT_SUPPORTED while MIG is disabled (nvml.h).
    # Off: the profile tables can be read whatever the mode, as older simulated nodes did.
    "profile_info_needs_mig": True,
}


def semantics(state: State) -> dict[str, bool]:
    """The node's driver behaviours: :data:`SEMANTICS` overridden by the node's own choice."""
    chosen: dict[str, bool] = state.get("semantics") or {}
    return {key: bool(chosen.get(key, default)) for key, default in SEMANTICS.items()}


# Per-link NVLink error counters the simulator keeps (NVML_NVLINK_ERROR_DL_*).
NVLINK_COUNTERS = ("replay", "recovery", "crc_flit")


def no_faults() -> dict[str, Any]:
    """A GPU's fault flags with nothing wrong (fresh node, or after ``clear``)."""
    return {"lost": False, "thermal": False, "nvlink_down": [], "power": None, "nvml_errors": {}}


def nvlink_counters(gpu: Gpu, link: int) -> dict[str, int]:
    """Link ``link``'s error counters (zeros for a link that never had one)."""
    stored: dict[str, dict[str, int]] = gpu.get("nvlink_counters", {})
    found = stored.get(str(link))
    return dict(found) if found else dict.fromkeys(NVLINK_COUNTERS, 0)


# The name a process gets when its caller gives none (what a CUDA job most often runs).
DEFAULT_PROCESS_NAME = "python3"


def err(code: int) -> pynvml.NVMLError:
    """The pynvml exception for ``code`` (its subclass, e.g. ``NVMLError_InUse``)."""
    return pynvml.NVMLError(code)


def gpu_model(gpu: Gpu) -> models.GpuModel:
    """The catalog entry of a GPU in the state."""
    return models.MODELS[gpu["model"]]


def get_gpu(state: State, index: int) -> Gpu:
    """GPU ``index`` of the state. Raises INVALID_ARGUMENT when out of range."""
    gpus: list[Gpu] = state["gpus"]
    if not 0 <= index < len(gpus):
        raise err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return gpus[index]


def next_serial(state: State) -> int:
    """A new creation serial (stale-handle detection, MIG UUIDs)."""
    serial = int(state["next_serial"])
    state["next_serial"] = serial + 1
    return serial


def process_name(state: State, pid: int) -> str:
    """The command name of process ``pid``. Raises NOT_FOUND for a PID not on any GPU."""
    for proc in state["processes"]:
        if proc["pid"] == pid:
            return str(proc.get("name", DEFAULT_PROCESS_NAME))
    raise err(pynvml.NVML_ERROR_NOT_FOUND)


def processes_on(state: State, index: int, gi: int | None = None) -> list[dict[str, Any]]:
    """Processes on GPU ``index`` (optionally only those on GPU instance ``gi``)."""
    return [p for p in state["processes"] if p["gpu"] == index and (gi is None or p["gi"] == gi)]


# --- MIG mode and reset ---------------------------------------------------------------------


def require_mig_capable(gpu: Gpu) -> models.GpuModel:
    """The GPU's model; NOT_SUPPORTED when it has no MIG."""
    model = gpu_model(gpu)
    if not model.mig_capable:
        raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)
    return model


def require_mig_enabled(gpu: Gpu) -> models.GpuModel:
    """The GPU's model; NOT_SUPPORTED unless MIG is capable and currently enabled."""
    model = require_mig_capable(gpu)
    if not gpu["mig"]["current"]:
        raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)
    return model


def set_mig_mode(state: State, index: int, mode: int, now: float | None = None) -> int:
    """Set the MIG mode; return the activation status NVML would report.

    The status is IN_USE while processes run on the GPU (the driver could not unbind it), else
    SUCCESS. With the ``mig_mode_applies_at_once`` semantics (the default) an idle GPU switches
    at once, as the driver does (resetting an Ampere GPU itself), and a busy one stays pending
    until the mode is requested again on the idle GPU or the GPU is reset (``reset_gpu``);
    without it every change waits for the reset.
    """
    gpu = get_gpu(state, index)
    require_mig_capable(gpu)
    if mode not in (pynvml.NVML_DEVICE_MIG_DISABLE, pynvml.NVML_DEVICE_MIG_ENABLE):
        raise err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    gpu["mig"]["pending"] = mode
    if processes_on(state, index):
        return int(pynvml.NVML_ERROR_IN_USE)
    if semantics(state)["mig_mode_applies_at_once"] and gpu["mig"]["current"] != mode:
        if gpu_model(gpu).generation == "ampere":
            reset_gpu(state, index, float(state.get("created_s", 0.0)) if now is None else now)
        else:
            # Hopper and newer switch without a reset: nothing else about the GPU changes.
            gpu["mig"]["current"] = mode
            gpu["instances"] = []
    return int(pynvml.NVML_SUCCESS)


def reset_gpu(state: State, index: int, now: float) -> None:
    """What ``nvidia-smi -r`` does: apply the pending MIG mode and wipe all instances.

    Raises IN_USE while processes run, GPU_IS_LOST on a lost GPU.
    """
    gpu = get_gpu(state, index)
    if gpu["faults"]["lost"]:
        raise err(pynvml.NVML_ERROR_GPU_IS_LOST)
    if processes_on(state, index):
        raise err(pynvml.NVML_ERROR_IN_USE)
    gpu["mig"]["current"] = gpu["mig"]["pending"]
    gpu["instances"] = []
    # A reset resolves pending row remaps and page retirements and clears volatile ECC counts.
    gpu["remap"]["pending"] = 0
    gpu["retired"]["pending"] = 0
    gpu["ecc"]["sbe_vol"] = 0
    gpu["ecc"]["dbe_vol"] = 0
    checkpoint_energy(state, index, now)


# --- GPU instances --------------------------------------------------------------------------


def _overlaps(a_start: int, a_size: int, b_start: int, b_size: int) -> bool:
    return a_start < b_start + b_size and b_start < a_start + a_size


def _free(gpu: Gpu, start: int, size: int) -> bool:
    return not any(_overlaps(start, size, gi["start"], gi["size"]) for gi in gpu["instances"])


def _engines_free(gpu: Gpu, profile: models.GiProfile) -> bool:
    """Whether the GPU's decoders, JPEG and OFA engines not yet owned cover ``profile``'s."""
    model = gpu_model(gpu)
    pool_dec, pool_jpeg, pool_ofa = model.engine_pool
    held = [p for gi in gpu["instances"] if (p := model.profile_by_id(gi["profile_id"]))]
    return (
        sum(p.decoders for p in held) + profile.decoders <= pool_dec
        and sum(p.jpeg for p in held) + profile.jpeg <= pool_jpeg
        and sum(p.ofa for p in held) + profile.ofa <= pool_ofa
    )


def remaining_capacity(gpu: Gpu, profile: models.GiProfile) -> int:
    """How many more instances of ``profile`` fit now (placement, count, SM and engine limits).

    Engines: a GPU has the media engines of its whole-GPU profile and every instance owns its
    own, so a second "+me" instance finds no JPEG/OFA left on an A30 or an A100 (the A30 has one
    of each: MIG User Guide A30 table), whatever room its slices have.
    """
    model = gpu_model(gpu)
    existing = sum(1 for gi in gpu["instances"] if gi["profile_id"] == profile.profile_id)
    used_compute = sum(
        p.compute_slices
        for gi in gpu["instances"]
        if (p := model.profile_by_id(gi["profile_id"])) is not None
    )
    by_compute = (model.max_mig_devices - used_compute) // profile.compute_slices
    if not _engines_free(gpu, profile):
        return 0
    fitting = 0
    taken: list[tuple[int, int]] = []
    for start in profile.starts:  # greedy from the left is optimal for aligned equal sizes
        if _free(gpu, start, profile.slices) and not any(
            _overlaps(start, profile.slices, s, n) for s, n in taken
        ):
            taken.append((start, profile.slices))
            fitting += 1
    return max(0, min(fitting, profile.max_count - existing, by_compute))


def default_order(starts: Sequence[int], size: int, memory_slices: int | None = None) -> list[int]:
    """The order in which ``nvmlDeviceCreateGpuInstance`` tries a profile's legal starts.

    Upper half of the memory slices first: its last legal start, then the others there from the
    bottom up; then the lower half from the bottom up. For the 8-slice parts that gives 1g
    6, 4, 5, 0, 1, 2, 3; 2g 4, 0, 2; 3g 4, 0 (MIG user guide examples, public ``-lgi``
    outputs). ``memory_slices`` defaults to the smallest power of two that holds every
    placement (8, or 4 on an A30).
    """
    ordered = sorted(set(starts))
    if not ordered:
        return []
    total = memory_slices or 1 << (max(ordered) + size - 1).bit_length()
    upper = [s for s in ordered if s >= total // 2]
    lower = [s for s in ordered if s < total // 2]
    if upper:
        upper = [upper[-1], *upper[:-1]]
    return upper + lower


def default_start(
    starts: Sequence[int],
    size: int,
    taken: Iterable[tuple[int, int]],
    memory_slices: int | None = None,
) -> int | None:
    """The start ``nvmlDeviceCreateGpuInstance`` picks without a placement (:func:`default_order`).

    A pure function of the profile's legal ``starts`` (each ``size`` memory slices) and the
    ``(start, size)`` of the instances already on the GPU; ``None`` when no legal start is free.
    The profile's count, compute and engine limits are the caller's to check. The churn
    benchmark (bench/mig_churn.py) measures this rule as the driver-default baseline.
    """
    held = list(taken)
    for start in default_order(starts, size, memory_slices):
        if not any(_overlaps(start, size, a, n) for a, n in held):
            return start
    return None


def pick_placement(gpu: Gpu, profile: models.GiProfile) -> int | None:
    """The start ``nvmlDeviceCreateGpuInstance`` picks on ``gpu`` (:func:`default_start`)."""
    taken = [(gi["start"], gi["size"]) for gi in gpu["instances"]]
    return default_start(profile.starts, profile.slices, taken, gpu_model(gpu).memory_slices)


def create_gpu_instance(
    state: State, index: int, profile_id: int, start: int | None, size: int | None = None
) -> dict[str, Any]:
    """Create a GPU instance; ``start=None`` lets the placement heuristic choose.

    Raises NOT_SUPPORTED (no MIG), INVALID_ARGUMENT (unknown profile, illegal placement),
    INSUFFICIENT_RESOURCES (overlap, or the profile's capacity is used up).
    """
    gpu = get_gpu(state, index)
    model = require_mig_enabled(gpu)
    profile = model.profile_by_id(profile_id)
    if profile is None:
        raise err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    if start is not None and (start not in profile.starts or size != profile.slices):
        raise err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    if remaining_capacity(gpu, profile) == 0:
        raise err(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
    if start is None:
        start = pick_placement(gpu, profile)
        if start is None:
            raise err(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
    elif not _free(gpu, start, profile.slices):
        raise err(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
    gi_id = models.gi_instance_id(
        model.memory_slices, profile.slices, (g["id"] for g in gpu["instances"])
    )
    if gi_id is None:
        raise err(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
    gi = {
        "id": gi_id,
        "profile_id": profile.profile_id,
        "start": start,
        "size": profile.slices,
        "serial": next_serial(state),
        "cis": [],
    }
    gpu["instances"].append(gi)
    gpu["instances"].sort(key=lambda g: g["id"])
    return gi


def find_gi(gpu: Gpu, gi_id: int) -> dict[str, Any] | None:
    """The GPU instance with this ID, or ``None``."""
    for gi in gpu["instances"]:
        if gi["id"] == gi_id:
            found: dict[str, Any] = gi
            return found
    return None


def destroy_gpu_instance(state: State, index: int, gi_id: int) -> None:
    """Destroy a GPU instance. IN_USE while it has compute instances or processes."""
    gpu = get_gpu(state, index)
    require_mig_enabled(gpu)
    gi = find_gi(gpu, gi_id)
    if gi is None:
        raise err(pynvml.NVML_ERROR_NOT_FOUND)
    if gi["cis"] or processes_on(state, index, gi_id):
        raise err(pynvml.NVML_ERROR_IN_USE)
    gpu["instances"].remove(gi)


# --- compute instances ----------------------------------------------------------------------


def gi_profile_of(gpu: Gpu, gi: dict[str, Any]) -> models.GiProfile:
    """The GI profile of a stored GPU instance."""
    profile = gpu_model(gpu).profile_by_id(gi["profile_id"])
    assert profile is not None  # stored instances always name a catalog profile
    return profile


def ci_remaining_capacity(gi: dict[str, Any], gip: models.GiProfile, ci: models.CiProfile) -> int:
    """How many more CIs of ``ci`` fit in the GI now."""
    existing = sum(1 for c in gi["cis"] if c["profile_id"] == ci.profile_id)
    used: int = sum(c["size"] for c in gi["cis"])
    fitting = sum(
        1
        for s in ci.starts
        if not any(_overlaps(s, ci.slices, c["start"], c["size"]) for c in gi["cis"])
    )
    return max(0, min(fitting, ci.max_count - existing, (gip.compute_slices - used) // ci.slices))


def create_compute_instance(
    state: State, index: int, gi_id: int, ci_profile_id: int, start: int | None
) -> dict[str, Any]:
    """Create a compute instance in GI ``gi_id`` (lowest free slot unless ``start`` is given)."""
    gpu = get_gpu(state, index)
    require_mig_enabled(gpu)
    gi = find_gi(gpu, gi_id)
    if gi is None:
        raise err(pynvml.NVML_ERROR_NOT_FOUND)
    gip = gi_profile_of(gpu, gi)
    cip = models.ci_profile(gip, ci_profile_id)
    if cip is None:
        raise err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    if start is not None and start not in cip.starts:
        raise err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    if ci_remaining_capacity(gi, gip, cip) == 0:
        raise err(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
    free = [
        s
        for s in cip.starts
        if not any(_overlaps(s, cip.slices, c["start"], c["size"]) for c in gi["cis"])
    ]
    if start is None:
        start = free[0] if free else None
    if start is None or start not in free:
        raise err(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
    used_ids = {c["id"] for c in gi["cis"]}
    ci_id = next(i for i in range(len(used_ids) + 1) if i not in used_ids)
    serial = next_serial(state)
    ci = {
        "id": ci_id,
        "profile_id": cip.profile_id,
        "start": start,
        "size": cip.slices,
        "serial": serial,
        "uuid": presets.mig_uuid(gpu["uuid"], serial),
    }
    gi["cis"].append(ci)
    gi["cis"].sort(key=lambda c: c["id"])
    return ci


def destroy_compute_instance(state: State, index: int, gi_id: int, ci_id: int) -> None:
    """Destroy a compute instance. IN_USE while processes run on it."""
    gpu = get_gpu(state, index)
    require_mig_enabled(gpu)
    gi = find_gi(gpu, gi_id)
    ci = None if gi is None else next((c for c in gi["cis"] if c["id"] == ci_id), None)
    if gi is None or ci is None:
        raise err(pynvml.NVML_ERROR_NOT_FOUND)
    if any(p["ci"] == ci_id for p in processes_on(state, index, gi_id)):
        raise err(pynvml.NVML_ERROR_IN_USE)
    gi["cis"].remove(ci)


def mig_devices(gpu: Gpu) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(GI, CI) pairs in MIG-device index order: by GI ID, then CI ID."""
    return [(gi, ci) for gi in gpu["instances"] for ci in gi["cis"]]


def find_mig_uuid(state: State, mig_uuid: str) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """(GPU index, GI, CI) of a MIG device UUID. Raises NOT_FOUND."""
    for gpu in state["gpus"]:
        for gi, ci in mig_devices(gpu):
            if ci["uuid"] == mig_uuid:
                return gpu["index"], gi, ci
    raise err(pynvml.NVML_ERROR_NOT_FOUND)


# --- processes and energy -------------------------------------------------------------------


def checkpoint_energy(state: State, index: int, now: float) -> None:
    """Fold the energy used so far into the GPU's checkpoint before its load changes."""
    gpu = get_gpu(state, index)
    gpu["energy"] = {"t": now, "mj": telemetry.energy_mj(gpu, processes_on(state, index), now)}


def device_memory_mib(state: State, index: int, gi: State | None) -> tuple[int, int, int]:
    """(total, reserved, used) MiB of GPU ``index`` or of its GPU instance ``gi``; used is
    what processes allocated (plus the driver's idle MiB on a whole GPU), reserved apart."""
    gpu = get_gpu(state, index)
    model = gpu_model(gpu)
    if gi is None:
        used = telemetry.IDLE_MEMORY_MIB + sum(p["mem_mib"] for p in processes_on(state, index))
        return model.memory_mib, model.reserved_mib, used
    _, total = model.reported(gi_profile_of(gpu, gi), str(state["driver_version"]))
    return total, 0, sum(p["mem_mib"] for p in processes_on(state, index, gi["id"]))


def add_process(
    state: State,
    index: int,
    mig_uuid: str | None,
    used_memory_mib: int,
    load: float | None,
    now: float,
    pid: int | None = None,
    name: str = DEFAULT_PROCESS_NAME,
    mps: bool = False,
) -> int:
    """Attach a process to a GPU or MIG device; return its PID.

    ``load`` is the share of the GPU's time the process asks for (``None``: a default for a
    whole GPU or its MIG slice); ``mps`` makes it an MPS client, listed by the MPS process
    query too, as the driver lists the clients of an MPS server.

    ``pid`` attaches a process that exists on the host (so tools that look it up, as gpustat
    and nvitop do with psutil, find it); ``None`` makes up a PID from the node's counter.
    """
    gpu = get_gpu(state, index)
    gi_id = ci_id = None
    gi: State | None = None
    if mig_uuid is not None:
        owner, gi, ci = find_mig_uuid(state, mig_uuid)
        if owner != index:
            raise err(pynvml.NVML_ERROR_NOT_FOUND)
        gi_id, ci_id = gi["id"], ci["id"]
    elif gpu["mig"]["current"]:
        # With MIG on, CUDA sees only MIG devices: a process must name one.
        raise err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    if pid is not None and any(p["pid"] == pid for p in state["processes"]):
        raise err(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # already attached
    total, reserved, used = device_memory_mib(state, index, gi)
    if used_memory_mib > total - reserved - used:
        # A CUDA allocation beyond the device's free memory fails (out of memory).
        raise err(pynvml.NVML_ERROR_MEMORY)
    checkpoint_energy(state, index, now)
    if pid is None:
        pid = int(state["next_pid"])
        state["next_pid"] = pid + 1
    state["processes"].append(
        {
            "pid": pid,
            "gpu": index,
            "gi": gi_id,
            "ci": ci_id,
            "mem_mib": int(used_memory_mib),
            "load": load,
            "started_s": now,
            "name": name,
            "mps": mps,
        }
    )
    return pid


def remove_process(state: State, pid: int, now: float) -> None:
    """Detach a fake process. Raises NOT_FOUND for an unknown PID."""
    for proc in state["processes"]:
        if proc["pid"] == pid:
            checkpoint_energy(state, proc["gpu"], now)
            state["processes"].remove(proc)
            return
    raise err(pynvml.NVML_ERROR_NOT_FOUND)


# --- faults ---------------------------------------------------------------------------------


def _event(
    state: State, index: int, event_type: int, data: int, now: float, gi: int = NO_ID,
    ci: int = NO_ID,
) -> None:  # fmt: skip
    append_event(
        state, {"gpu": index, "type": event_type, "data": data, "gi": gi, "ci": ci, "t": now}
    )


class FaultArgs(TypedDict, total=False):
    """What a fault takes besides its kind and GPU; left out or ``None``: not given.

    ``mig_uuid`` the MIG device an XID names; ``code`` the XID (xid), the link (nvlink-down,
    nvlink-errors) or the NVML return code (nvml-error); ``version`` the new driver version
    (driver); ``count`` the size of a counter burst (pcie-replay, nvlink-errors); ``function``
    the NVML function that fails (nvml-error). docs/simulator.md lists the defaults.
    """

    mig_uuid: str | None
    code: int | None
    version: str | None
    count: int | None
    function: str | None


def inject(state: State, kind: str, index: int, now: float, **args: Unpack[FaultArgs]) -> None:
    """Inject a fault into GPU ``index`` (kinds in ``FAULT_KINDS``; see docs/simulator.md).

    Raises ValueError for a kind that needs an argument it did not get; NVMLError for an
    unknown MIG UUID or a GPU without the feature.
    """
    mig_uuid, code, count = args.get("mig_uuid"), args.get("code"), args.get("count")
    gpu = get_gpu(state, index)
    model = gpu_model(gpu)
    xid_type = pynvml.nvmlEventTypeXidCriticalError
    if kind == "xid":
        if code is None:
            raise ValueError("fault 'xid' needs an XID code")
        gi_id = ci_id = NO_ID
        if mig_uuid is not None:
            owner, gi, ci = find_mig_uuid(state, mig_uuid)
            if owner != index:
                raise err(pynvml.NVML_ERROR_NOT_FOUND)
            gi_id, ci_id = gi["id"], ci["id"]
        if code == XID_FALLEN_OFF_BUS:
            # XID 79 is the driver reporting the GPU gone from the bus: whatever the reported
            # MIG device, the whole GPU stops answering, as with the `lost` kind.
            faults_of(gpu)["lost"] = True
        _event(state, index, xid_type, code, now, gi_id, ci_id)
    elif kind == "ecc-sbe":
        gpu["ecc"]["sbe_vol"] += 1
        gpu["ecc"]["sbe_agg"] += 1
        _event(state, index, pynvml.nvmlEventTypeSingleBitEccError, 0, now)
    elif kind == "ecc-dbe":
        gpu["ecc"]["dbe_vol"] += 1
        gpu["ecc"]["dbe_agg"] += 1
        if model.row_remapping:
            gpu["remap"]["unc"] += 1
            gpu["remap"]["pending"] = 1
        else:
            # Turing retires the page; the address is made up but distinct per error.
            gpu["retired"]["dbe"].append(0x1000 * (len(gpu["retired"]["dbe"]) + 1) + index)
            gpu["retired"]["pending"] = 1
        _event(state, index, pynvml.nvmlEventTypeDoubleBitEccError, 0, now)
        _event(state, index, xid_type, XID_DBE, now)
    elif kind in ("remap-pending", "remap-failure"):
        if not model.row_remapping:
            raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if kind == "remap-pending":
            gpu["remap"]["pending"] = 1
            _event(state, index, xid_type, XID_REMAP_PENDING, now)
        else:
            gpu["remap"]["failure"] = 1
            _event(state, index, xid_type, XID_REMAP_FAILURE, now)
    elif kind == "thermal":
        gpu["faults"]["thermal"] = True
    elif kind == "nvlink-down":
        link = _link_arg(gpu, code)
        if link not in gpu["faults"]["nvlink_down"]:
            gpu["faults"]["nvlink_down"].append(link)
        gpu["nvlink_errors"] += 1
        _event(state, index, xid_type, XID_NVLINK, now)
    elif kind == "lost":
        gpu["faults"]["lost"] = True
        _event(state, index, xid_type, XID_FALLEN_OFF_BUS, now)
    elif kind == "driver":
        version = args.get("version")
        if not version:
            raise ValueError("fault 'driver' needs a version, e.g. 570.172.08")
        state["driver_version"] = version
    elif kind == "pcie-replay":
        # The replay counter only grows (NVML has no event for it); the agent sees the rate.
        gpu["pcie_replay"] = int(gpu.get("pcie_replay", 0)) + _count_arg(count, PCIE_REPLAY_BURST)
    elif kind == "nvlink-errors":
        link = _link_arg(gpu, code)
        burst = _count_arg(count, NVLINK_ERROR_BURST)
        counters = nvlink_counters(gpu, link)
        # Each flit that fails its CRC is replayed; a burst this size also retrains the link once.
        counters["crc_flit"] += burst
        counters["replay"] += burst
        counters["recovery"] += 1
        gpu.setdefault("nvlink_counters", {})[str(link)] = counters
    elif kind in ("power-cap", "power-brake"):
        # Power and clocks change shape: fold the energy used so far in before they do.
        checkpoint_energy(state, index, now)
        faults_of(gpu)["power"] = "cap" if kind == "power-cap" else "brake"
    elif kind == "nvml-error":
        name = args.get("function") or NVML_ERROR_FUNCTION
        failure = NVML_ERROR_CODE if code is None else code
        if failure <= 0:
            raise ValueError(f"NVML return code {failure} is not an error; pass a code above 0")
        faults_of(gpu)["nvml_errors"][name] = failure
    else:
        raise ValueError(f"unknown fault kind {kind!r}; choose one of: {', '.join(FAULT_KINDS)}")


def faults_of(gpu: Gpu) -> dict[str, Any]:
    """The GPU's fault flags, with the keys newer fault kinds added (older state files)."""
    faults: dict[str, Any] = gpu["faults"]
    for key, value in no_faults().items():
        faults.setdefault(key, value)
    return faults


def _link_arg(gpu: Gpu, code: int | None) -> int:
    if not gpu["nvlinks"]:
        raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)
    link = 0 if code is None else code
    if not 0 <= link < len(gpu["nvlinks"]):
        raise ValueError(f"GPU {gpu['index']} has NVLinks 0..{len(gpu['nvlinks']) - 1}, not {link}")
    return link


def _count_arg(count: int | None, default: int) -> int:
    if count is None:
        return default
    if count < 1:
        raise ValueError(f"count {count} must be 1 or more")
    return count


def clear(state: State, index: int, now: float | None = None) -> None:
    """End GPU ``index``'s faults. Cumulative counters (ECC, remapped rows, pages) stay.

    ``now`` checkpoints the energy when a power fault ends (its power curve ends with it).
    """
    gpu = get_gpu(state, index)
    if now is not None and gpu["faults"].get("power"):
        checkpoint_energy(state, index, now)
    gpu["faults"] = no_faults()
    gpu["remap"]["pending"] = 0
    gpu["remap"]["failure"] = 0
    gpu["retired"]["pending"] = 0
