"""MIG through NVML: a GPU's profiles and placements, its instances, mode changes and resets."""

from __future__ import annotations

import ctypes
import dataclasses
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from nodeagent import migcatalog
from nodeagent.gpu import errors
from nodeagent.gpu.errors import GpuError, InUse, InvalidArgument, NotSupported
from nodeagent.gpu.inventory import Inventory
from nodeagent.gpu.nvml import NO_SUCH_ITEM, UNANSWERED, Nvml, text
from nodeagent.gpu.telemetry import Processes
from nodeagent.gpu.types import (
    ComputeInstance,
    GeometrySource,
    GpuInstance,
    MigGeometry,
    MigProfile,
    Placement,
    ProcessInfo,
)

_MIB = 1024 * 1024
# Profile-index enumeration stops at INVALID_ARGUMENT; this bound only guards against a driver
# that never says so (nvml.h defines 0x12 indices today).
_MAX_PROFILE_INDEX = 64

# The sampler re-reads a GPU's whole MIG layout (about nine NVML calls per MIG device) only
# when a cheap fingerprint of it changed (two calls per MIG device), and at least this often:
# what the fingerprint cannot see, a GPU instance without any compute instance (no MIG device,
# nothing can run on it; never left by the applier) made or destroyed by another program,
# shows within this bound.
FULL_READ_INTERVAL_S = 10.0

# The handle type of what each listing call fills in.
_INSTANCE_HANDLE_TYPES = {
    "nvmlDeviceGetGpuInstances": "c_nvmlGpuInstance_t",
    "nvmlGpuInstanceGetComputeInstances": "c_nvmlComputeInstance_t",
}

# How a GPU is reset so that a pending MIG mode takes effect: called with the GPU index and its
# PCI bus id. NVML has no reset call, so the program's edge chooses one: ``nvidia-smi -r`` on a
# real host (:func:`nvidia_smi_reset`), the simulator's own on a simulated node. It may raise a
# taxonomy error or an ``NVMLError`` of the module in use (translated like any NVML call).
ResetFunction = Callable[[int, str], None]


@dataclass(frozen=True, slots=True)
class MigModeChange:
    """Result of a MIG mode change request."""

    gpu_index: int
    current: bool
    pending: bool
    # The new mode is not in effect yet (current and pending differ): it takes effect when the
    # mode is requested again on an idle GPU, or at a GPU reset.
    reset_required: bool
    reason: str | None  # why the change is not active yet (processes running, say)


@dataclass(frozen=True, slots=True)
class _CiProfile:
    """A compute-instance profile available inside GPU instances of one GI profile."""

    profile_id: int
    slice_count: int
    max_count: int


def _profile(
    nvml_index: int, info: Any, placements: tuple[Placement, ...], smallest_mib: int
) -> MigProfile:
    """A GPU-instance profile from NVML's profile info (v2) and its possible placements.

    NVML's ``sliceCount`` counts SM (compute) slices: 3 for a 3g profile, which occupies 4 memory
    slices. The memory-slice count is the placement size. Where NVML withheld the placements
    (no privilege) it is estimated from the profile's memory in units of the smallest profile's,
    which gives 1/2/4/8 on every table in the reference notes.
    """
    memory_mib = int(info.memorySizeMB)
    slices = placements[0].size if placements else max(1, round(memory_mib / smallest_mib))
    return MigProfile(
        name=text(info.name).removeprefix("MIG ").strip(),
        profile_id=int(info.id),
        nvml_index=nvml_index,
        slices=slices,
        compute_slices=int(info.sliceCount),
        multiprocessors=int(info.multiprocessorCount),
        memory_bytes=memory_mib * _MIB,
        max_count=int(info.instanceCount),
        copy_engines=int(info.copyEngineCount),
        decoders=int(info.decoderCount),
        jpeg_decoders=int(info.jpegCount),
        ofa=int(info.ofaCount),
        placements=placements,
    )


def _catalog_profile(
    model: migcatalog.MigModel, p: migcatalog.GiProfile, driver: str
) -> MigProfile:
    """A profile of the built-in catalog, named and sized as driver ``driver`` reports it."""
    name, memory_mib = model.reported(p, driver)
    return MigProfile(
        name=name,
        profile_id=p.profile_id,
        nvml_index=p.nvml_index,
        slices=p.slices,
        compute_slices=p.compute_slices,
        multiprocessors=p.multiprocessors,
        memory_bytes=memory_mib * _MIB,
        max_count=p.max_count,
        copy_engines=p.copy_engines,
        decoders=p.decoders,
        jpeg_decoders=p.jpeg,
        ofa=p.ofa,
        placements=tuple(Placement(start, p.slices) for start in p.starts),
    )


def _geometry(
    model: str, profiles: list[MigProfile], memory_slices: int, source: GeometrySource
) -> MigGeometry:
    """One order for every geometry: largest placements first, then the most SMs, then name."""
    profiles.sort(key=lambda p: (-p.slices, -p.compute_slices, p.name))
    return MigGeometry(model, memory_slices, tuple(profiles), source)


def _pids_on(processes: tuple[ProcessInfo, ...], gpu_instance_id: int) -> tuple[int, ...]:
    return tuple(p.pid for p in processes if p.gpu_instance_id == gpu_instance_id)


def _with_pids(instance: GpuInstance, pids: tuple[int, ...]) -> GpuInstance:
    return instance if instance.pids == pids else dataclasses.replace(instance, pids=pids)


class MigControl:
    """MIG on every GPU of the node: read geometry and instances, change mode and layout."""

    def __init__(
        self, nvml: Nvml, inventory: Inventory, processes: Processes, reset: ResetFunction
    ) -> None:
        self._nvml = nvml
        self._inventory = inventory
        self._processes = processes
        self._reset = reset
        self._geometry: dict[int, MigGeometry] = {}
        # What stands in while MIG is off and the driver will not list profiles (the catalog's
        # geometry, or an empty one for a model it lacks); the driver is asked once.
        self._stand_in: dict[int, MigGeometry] = {}
        self._ci_profiles: dict[tuple[int, int], tuple[_CiProfile, ...]] = {}
        self.full_read_interval_s = FULL_READ_INTERVAL_S
        # Per GPU: (monotonic time of the full read, the fingerprint then, what it found).
        self._sampled: dict[int, tuple[float, tuple[str, ...], tuple[GpuInstance, ...]]] = {}

    def processes(self, index: int) -> tuple[ProcessInfo, ...]:
        """The compute processes of GPU ``index`` (what makes an instance busy)."""
        return self._processes(index)

    def mig_geometry(self, index: int) -> MigGeometry | None:
        """The GPU's MIG profiles and legal placements, or ``None`` when it is not MIG-capable.

        Read from the driver whenever it answers, which current drivers do only while MIG is
        enabled (nvml.h: ``nvmlDeviceGetGpuInstanceProfileInfo*`` is NOT_SUPPORTED otherwise).
        While MIG is off and the driver is silent, the built-in catalog stands in
        (:mod:`nodeagent.migcatalog`, by PCI device ID and memory; ``source`` says which), so a
        layout can be validated and planned before MIG is enabled; once MIG is on, the driver's
        table is read again and preferred. A model the catalog lacks gets no profiles.
        """
        cached = self._geometry.get(index)
        if cached is not None:
            return cached
        capable, enabled, _ = self._inventory.mig_mode(index)
        if not capable:
            return None
        stand_in = self._stand_in.get(index)
        if stand_in is not None and not enabled:
            return stand_in
        geometry = self._read_geometry(index)
        # Profile info is immutable for the life of a MIG mode, so the driver's table is kept; an
        # empty one (MIG off) is asked again once the mode changes.
        if geometry.profiles:
            self._geometry[index] = geometry
            return geometry
        if enabled:
            return geometry
        stand_in = self._catalog_geometry(index) or geometry
        self._stand_in[index] = stand_in
        return stand_in

    def _read_geometry(self, index: int) -> MigGeometry:
        """The profile table and placements as the driver reports them (empty when it won't)."""
        h = self._nvml.handle(index)
        found: list[tuple[int, Any, tuple[Placement, ...]]] = []
        for nvml_index in range(_MAX_PROFILE_INDEX):
            info, code = self._nvml.attempt(
                "nvmlDeviceGetGpuInstanceProfileInfo",
                h,
                nvml_index,
                2,
                gpu=index,
                expected=NO_SUCH_ITEM,
            )
            if code == errors.NVML_ERROR_INVALID_ARGUMENT:
                break  # the documented end of the enumeration
            if code == errors.NVML_SUCCESS:
                found.append((nvml_index, info, self._placements(index, h, int(info.id))))
        smallest_mib = min((max(int(info.memorySizeMB), 1) for _, info, _ in found), default=1)
        profiles = [
            _profile(nvml_index, info, placements, smallest_mib)
            for nvml_index, info, placements in found
        ]
        memory_slices = max(
            (q.end for p in profiles for q in p.placements),
            default=max((p.slices for p in profiles), default=0),
        )
        name = self._inventory.static(index).name
        return _geometry(name, profiles, memory_slices, GeometrySource.DRIVER)

    def _catalog_geometry(self, index: int) -> MigGeometry | None:
        """The built-in catalog's geometry of this GPU's model, or ``None`` if it lacks it."""
        static = self._inventory.static(index)
        model = migcatalog.lookup(static.pci_device_id, static.memory_total_bytes // _MIB)
        if model is None:
            return None
        driver = self._inventory.driver_version()
        profiles = [_catalog_profile(model, p, driver) for p in model.profiles]
        return _geometry(static.name, profiles, model.memory_slices, GeometrySource.CATALOG)

    def _placements(self, index: int, handle: Any, profile_id: int) -> tuple[Placement, ...]:
        fn = "nvmlDeviceGetGpuInstancePossiblePlacements"
        count = ctypes.c_uint(0)
        # A NULL buffer asks for the number of placements (nvml.h), then a buffer of that size.
        # The query needs privilege on some drivers: without it the placements are unknown
        # (an empty tuple), which is not a reason to fail the whole profile table.
        _, code = self._nvml.attempt(
            fn, handle, profile_id, None, ctypes.byref(count), gpu=index, expected=UNANSWERED
        )
        if code != errors.NVML_SUCCESS or not count.value:
            return ()
        buffer = (self._nvml.module.c_nvmlGpuInstancePlacement_t * count.value)()
        self._nvml.call(fn, handle, profile_id, buffer, ctypes.byref(count), gpu=index)
        found = {Placement(int(p.start), int(p.size)) for p in buffer[: count.value]}
        return tuple(sorted(found, key=lambda p: (p.start, p.size)))

    def _ci_profile_table(self, index: int, gi: Any, gi_profile_id: int) -> tuple[_CiProfile, ...]:
        """Compute-instance profiles offered inside GIs of one profile (immutable, cached)."""
        key = (index, gi_profile_id)
        cached = self._ci_profiles.get(key)
        if cached is not None:
            return cached
        engine = self._nvml.const("NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", 0)
        table: list[_CiProfile] = []
        for ci_index in range(self._nvml.const("NVML_COMPUTE_INSTANCE_PROFILE_COUNT", 9)):
            info, code = self._nvml.attempt(
                "nvmlGpuInstanceGetComputeInstanceProfileInfo",
                gi,
                ci_index,
                engine,
                2,
                gpu=index,
                expected=NO_SUCH_ITEM,
            )
            if code == errors.NVML_SUCCESS:
                table.append(
                    _CiProfile(int(info.id), int(info.sliceCount), int(info.instanceCount))
                )
        result = tuple(table)
        self._ci_profiles[key] = result
        return result

    def _gpu_instance_handles(self, index: int, geometry: MigGeometry) -> list[Any]:
        """The handles of the GPU's GPU instances, of every profile."""
        h = self._nvml.handle(index)
        return [
            gi
            for profile in geometry.profiles
            if profile.max_count > 0
            for gi in self._instances(
                index, "nvmlDeviceGetGpuInstances", h, profile.profile_id, profile.max_count
            )
        ]

    def _instances(
        self, index: int, function: str, parent: Any, profile_id: int, max_count: int
    ) -> list[Any]:
        """The handles ``function`` lists of one profile's instances inside ``parent``."""
        struct = getattr(self._nvml.module, _INSTANCE_HANDLE_TYPES[function])
        buffer = (struct * max_count)()
        count = ctypes.c_uint(max_count)
        self._nvml.call(function, parent, profile_id, buffer, ctypes.byref(count), gpu=index)
        return list(buffer[: count.value])

    def _mig_devices(self, index: int) -> Iterator[Any]:
        """The handles of the GPU's MIG devices (one per compute instance), by slot."""
        h = self._nvml.handle(index)
        for mig_index in range(
            int(self._nvml.call("nvmlDeviceGetMaxMigDeviceCount", h, gpu=index))
        ):
            mig, code = self._nvml.attempt(
                "nvmlDeviceGetMigDeviceHandleByIndex",
                h,
                mig_index,
                gpu=index,
                expected=frozenset({errors.NVML_ERROR_NOT_FOUND}),
            )
            if code == errors.NVML_SUCCESS:  # indices are sparse: no MIG device at this slot
                yield mig

    def _mig_device_uuids(self, index: int) -> dict[tuple[int, int], str]:
        """UUIDs of the MIG devices (one per compute instance), by (GI id, CI id)."""
        uuids: dict[tuple[int, int], str] = {}
        for mig in self._mig_devices(index):
            gi_id = int(self._nvml.call("nvmlDeviceGetGpuInstanceId", mig, gpu=index))
            ci_id = int(self._nvml.call("nvmlDeviceGetComputeInstanceId", mig, gpu=index))
            uuids[(gi_id, ci_id)] = text(self._nvml.call("nvmlDeviceGetUUID", mig, gpu=index))
        return uuids

    def read_instances(
        self, index: int, processes: tuple[ProcessInfo, ...], enabled: bool | None = None
    ) -> tuple[GpuInstance, ...]:
        """The GPU's instances, busy where one of ``processes`` runs on them (MIG on, else ())."""
        if enabled is None:
            _, enabled, _ = self._inventory.mig_mode(index)
        geometry = self.mig_geometry(index) if enabled else None
        if geometry is None:
            return ()
        names = {p.profile_id: p.name for p in geometry.profiles}
        uuids = self._mig_device_uuids(index)
        instances: list[GpuInstance] = []
        for gi in self._gpu_instance_handles(index, geometry):
            info = self._nvml.call("nvmlGpuInstanceGetInfo", gi, gpu=index)
            gi_id, profile_id = int(info.id), int(info.profileId)
            cis = self._read_compute_instances(index, gi, gi_id, profile_id, uuids)
            instances.append(
                GpuInstance(
                    gpu_index=index,
                    instance_id=gi_id,
                    profile=names.get(profile_id, f"profile-{profile_id}"),
                    profile_id=profile_id,
                    placement=Placement(int(info.placement.start), int(info.placement.size)),
                    compute_instances=cis,
                    pids=_pids_on(processes, gi_id),
                )
            )
        instances.sort(key=lambda g: (g.placement.start, g.placement.size, g.instance_id))
        return tuple(instances)

    def sample_instances(
        self, index: int, processes: tuple[ProcessInfo, ...], enabled: bool
    ) -> tuple[GpuInstance, ...]:
        """What :meth:`read_instances` returns, re-read in full only when the layout changed.

        For the sampler, which asks every second of a layout that changes a few times a day:
        the fingerprint (the MIG devices' UUIDs) sees every MIG device made or
        destroyed, by this process or another, at once; the full read is also repeated every
        ``full_read_interval_s``. Writers and the MIG applier use
        :meth:`mig_instances`, which always reads in full.
        """
        geometry = self.mig_geometry(index) if enabled else None
        if geometry is None:
            self._sampled.pop(index, None)
            return ()
        fingerprint = self._fingerprint(index)
        now = time.monotonic()
        cached = self._sampled.get(index)
        if (
            cached is not None
            and cached[1] == fingerprint
            and now - cached[0] < self.full_read_interval_s
        ):
            return tuple(_with_pids(gi, _pids_on(processes, gi.instance_id)) for gi in cached[2])
        instances = self.read_instances(index, processes, enabled)
        self._sampled[index] = (now, fingerprint, instances)
        return instances

    def _fingerprint(self, index: int) -> tuple[str, ...]:
        """The MIG devices' UUIDs: a compute instance made or destroyed changes them."""
        return tuple(
            text(self._nvml.call("nvmlDeviceGetUUID", mig, gpu=index))
            for mig in self._mig_devices(index)
        )

    def _ci_handles(self, index: int, gi: Any, gi_profile_id: int) -> list[tuple[Any, _CiProfile]]:
        return [
            (ci, ci_profile)
            for ci_profile in self._ci_profile_table(index, gi, gi_profile_id)
            if ci_profile.max_count > 0
            for ci in self._instances(
                index,
                "nvmlGpuInstanceGetComputeInstances",
                gi,
                ci_profile.profile_id,
                ci_profile.max_count,
            )
        ]

    def _read_compute_instances(
        self,
        index: int,
        gi: Any,
        gi_id: int,
        gi_profile_id: int,
        uuids: dict[tuple[int, int], str],
    ) -> tuple[ComputeInstance, ...]:
        found: list[ComputeInstance] = []
        for ci, ci_profile in self._ci_handles(index, gi, gi_profile_id):
            info = self._nvml.call("nvmlComputeInstanceGetInfo", ci, gpu=index)
            ci_id = int(info.id)
            found.append(
                ComputeInstance(
                    gpu_instance_id=gi_id,
                    instance_id=ci_id,
                    profile_id=int(info.profileId),
                    slice_count=ci_profile.slice_count,
                    placement=Placement(int(info.placement.start), int(info.placement.size)),
                    # Every CI forms a MIG device; "" only if NVML listed none for it.
                    uuid=uuids.get((gi_id, ci_id), ""),
                )
            )
        found.sort(key=lambda c: (c.placement.start, c.instance_id))
        return tuple(found)

    def mig_instances(self, index: int) -> tuple[GpuInstance, ...]:
        """Current GPU instances with compute instances and processes, sorted by placement."""
        return self.read_instances(index, self._processes(index))

    def set_mig_mode(self, index: int, enabled: bool) -> MigModeChange:
        """Request MIG on or off; a change that does not take effect is reported, not an error.

        An idle GPU switches at once: Hopper and newer need no reset, and on Ampere the driver
        resets the GPU itself (nvml.h: the call "may unbind or reset the device"). The mode stays
        pending when the activation fails, IN_USE while a process or client holds the GPU.
        """
        h = self._nvml.handle(index)
        mode = self._nvml.const(
            "NVML_DEVICE_MIG_ENABLE" if enabled else "NVML_DEVICE_MIG_DISABLE", 1
        )
        activation = int(self._nvml.call("nvmlDeviceSetMigMode", h, mode, gpu=index))
        _, current, pending = self._inventory.mig_mode(index)
        self._geometry.pop(index, None)
        self._ci_profiles = {k: v for k, v in self._ci_profiles.items() if k[0] != index}
        reset_required = current != pending
        reason: str | None = None
        if activation == errors.NVML_ERROR_IN_USE:
            reason = (
                "the GPU is in use (processes or other clients hold it); once they stop, the "
                "mode can be requested again or the GPU reset"
            )
        elif activation == errors.NVML_ERROR_RESET_REQUIRED:
            reason = "the GPU cannot be reset here (passthrough); reboot the machine or VM"
        elif activation != errors.NVML_SUCCESS:
            reason = f"activation failed with NVML error {activation}"
        elif reset_required:
            reason = "the new mode takes effect after a GPU reset"
        return MigModeChange(
            gpu_index=index,
            current=current,
            pending=pending,
            reset_required=reset_required,
            reason=reason,
        )

    def reset_gpu(self, index: int) -> None:
        """Reset the GPU so a pending MIG mode takes effect. Raises InUse while processes run."""
        static = self._inventory.static(index)
        # Checked here for every reset function: a reset kills whatever runs on the GPU.
        processes = self._processes(index)
        if processes:
            pids = ", ".join(str(p.pid) for p in processes)
            raise InUse(
                f"GPU {index} cannot be reset while processes run on it (pids {pids}); stop them",
                function="reset",
                gpu_index=index,
                nvml_code=errors.NVML_ERROR_IN_USE,
            )
        try:
            self._reset(index, static.pci_bus_id)
        except self._nvml.module.NVMLError as exc:
            self._nvml.count_error("reset")
            raise self._nvml.translate(exc, "reset", index) from exc
        # The reset drops every GPU and compute instance; cached handles stay valid for the GPU.
        self._geometry.pop(index, None)
        self._ci_profiles = {k: v for k, v in self._ci_profiles.items() if k[0] != index}

    def _mig_profile(self, index: int, profile: str) -> MigProfile:
        geometry = self.mig_geometry(index)
        if geometry is None:
            raise NotSupported(
                f"GPU {index} ({self._inventory.static(index).name}) does not support MIG",
                function="nvmlDeviceGetMigMode",
                gpu_index=index,
                nvml_code=errors.NVML_ERROR_NOT_SUPPORTED,
            )
        found = geometry.profile(profile)
        if found is not None:
            return found
        _, enabled, _ = self._inventory.mig_mode(index)
        if not enabled and not geometry.profiles:
            static = self._inventory.static(index)
            raise NotSupported(
                f"MIG is disabled on GPU {index}, its driver lists MIG profiles only while MIG "
                f"is enabled, and the built-in catalog lacks this model ({static.name}, PCI id "
                f"{static.pci_device_id:#010x}); enable MIG on it first",
                function="nvmlDeviceGetGpuInstanceProfileInfo",
                gpu_index=index,
                nvml_code=errors.NVML_ERROR_NOT_SUPPORTED,
            )
        names = ", ".join(p.name for p in geometry.profiles)
        raise InvalidArgument(
            f"GPU {index} ({geometry.model}) has no MIG profile {profile!r}; "
            f"choose one of: {names}",
            gpu_index=index,
            nvml_code=errors.NVML_ERROR_INVALID_ARGUMENT,
        )

    def create_gpu_instance(self, index: int, profile: str, placement: Placement) -> GpuInstance:
        """Create a GPU instance at an explicit placement plus one compute instance spanning it.

        Raises InsufficientResources on overlap or exhausted capacity, NotSupported when MIG is
        off, InvalidArgument for a placement the profile does not allow.
        """
        mig_profile = self._mig_profile(index, profile)
        h = self._nvml.handle(index)
        c_placement = self._nvml.module.c_nvmlGpuInstancePlacement_t()
        c_placement.start = placement.start
        c_placement.size = placement.size
        gi = self._nvml.call(
            "nvmlDeviceCreateGpuInstanceWithPlacement",
            h,
            mig_profile.profile_id,
            ctypes.byref(c_placement),
            gpu=index,
        )
        gi_id = int(self._nvml.call("nvmlGpuInstanceGetInfo", gi, gpu=index).id)
        try:
            table = self._ci_profile_table(index, gi, mig_profile.profile_id)
            if not table:
                raise NotSupported(
                    f"GPU {index}: no compute-instance profile fits a {profile} instance",
                    function="nvmlGpuInstanceGetComputeInstanceProfileInfo",
                    gpu_index=index,
                    nvml_code=errors.NVML_ERROR_NOT_SUPPORTED,
                )
            # The full-size CI: the most slices, and of equals the plain profile (lowest id)
            # rather than a variant such as the NVL-optimised 7-slice one.
            full = min(table, key=lambda c: (-c.slice_count, c.profile_id))
            self._nvml.call("nvmlGpuInstanceCreateComputeInstance", gi, full.profile_id, gpu=index)
        except GpuError:
            # Leave no half-made instance behind: without a CI the GI is unusable.
            self._nvml.call("nvmlGpuInstanceDestroy", gi, gpu=index)
            raise
        for instance in self.mig_instances(index):
            if instance.instance_id == gi_id:
                return instance
        raise GpuError(
            f"GPU {index}: instance {gi_id} vanished right after it was created",
            function="nvmlDeviceGetGpuInstances",
            gpu_index=index,
        )

    def destroy_gpu_instance(self, index: int, instance_id: int) -> None:
        """Destroy a GPU instance's compute instances, then the instance. Raises InUse when busy."""
        # Check for processes first, so that a busy instance is left whole rather than stripped
        # of some of its compute instances before NVML refuses.
        busy = [p.pid for p in self._processes(index) if p.gpu_instance_id == instance_id]
        if busy:
            raise InUse(
                f"GPU {index} instance {instance_id} runs processes "
                f"{', '.join(map(str, busy))}; stop them before destroying it",
                function="nvmlGpuInstanceDestroy",
                gpu_index=index,
                nvml_code=errors.NVML_ERROR_IN_USE,
            )
        h = self._nvml.handle(index)
        gi = self._nvml.call("nvmlDeviceGetGpuInstanceById", h, instance_id, gpu=index)
        profile_id = int(self._nvml.call("nvmlGpuInstanceGetInfo", gi, gpu=index).profileId)
        for ci, _ in self._ci_handles(index, gi, profile_id):
            self._nvml.call("nvmlComputeInstanceDestroy", ci, gpu=index)
        self._nvml.call("nvmlGpuInstanceDestroy", gi, gpu=index)

    def destroy_compute_instance(self, index: int, gpu_instance_id: int, ci_id: int) -> None:
        """Destroy one compute instance. Raises InUse while processes run on it."""
        h = self._nvml.handle(index)
        gi = self._nvml.call("nvmlDeviceGetGpuInstanceById", h, gpu_instance_id, gpu=index)
        ci = self._nvml.call("nvmlGpuInstanceGetComputeInstanceById", gi, ci_id, gpu=index)
        self._nvml.call("nvmlComputeInstanceDestroy", ci, gpu=index)


def nvidia_smi_reset(index: int, bus_id: str) -> None:
    """Reset a real GPU with ``nvidia-smi -r`` (the driver refuses while the GPU is in use)."""
    result = subprocess.run(
        ["nvidia-smi", "-r", "-i", bus_id], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        output = " ".join((result.stdout + " " + result.stderr).split())
        cls = InUse if "in use" in output.lower() else GpuError
        raise cls(
            f"nvidia-smi -r -i {bus_id} failed (exit {result.returncode}): {output}",
            function="nvidia-smi -r",
            gpu_index=index,
        )
