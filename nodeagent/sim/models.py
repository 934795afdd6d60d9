"""GPU model catalog for the simulator: product facts and MIG profile tables.

Pure data plus small lookups. Every fact names where it comes from in :data:`SOURCES`, one entry
per model and fact: a document (NVIDIA's MIG User Guide, a datasheet), a public ``nvidia-smi``
output with its driver version where the output shows one, or ``inferred: <reason>`` where no
public reading was found. ``tests/sim/test_sim_catalog.py`` pins the tables to those sources and
docs/simulator.md lists what is inferred.

Three integer spaces are kept apart here, as NVML keeps them apart:

* ``profile_id``: the device-specific GPU-instance profile ID (``info.id``; 19/20/15/14/9/5/0 on
  A100/H100/H200/B200, 14/21/5/6/0 on A30). Create, placement and capacity calls take this.
* ``nvml_index``: the ``NVML_GPU_INSTANCE_PROFILE_*`` constant passed to
  ``nvmlDeviceGetGpuInstanceProfileInfo`` to look a profile up.
* GPU-instance IDs, allocated per device as instances are created (see ``gi_instance_id``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import pynvml

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class CiProfile:
    """A compute-instance profile available inside a GPU instance of a given profile."""

    profile_id: int  # NVML_COMPUTE_INSTANCE_PROFILE_* value (nvidia-smi prints the same)
    slices: int  # SM slices: the "c" in "1c.3g.20gb"
    max_count: int
    starts: tuple[int, ...]  # legal starts in SM-slice units, relative to the GI


@dataclass(frozen=True, slots=True)
class GiProfile:
    """A GPU-instance profile of one GPU model."""

    name: str  # "1g.10gb", "1g.10gb+me"
    profile_id: int  # NVML profile ID (device specific)
    nvml_index: int  # NVML_GPU_INSTANCE_PROFILE_* constant
    slices: int  # memory slices occupied: the placement size
    compute_slices: int  # SM slices: the "g" in the name
    multiprocessors: int
    memory_mib: int  # memorySizeMB as NVML reports it
    max_count: int
    copy_engines: int
    decoders: int
    jpeg: int
    ofa: int
    starts: tuple[int, ...]  # legal placement starts, each of size ``slices``
    encoders: int = 0  # ENC is 0 on every datacenter part modelled here
    ci: tuple[CiProfile, ...] = ()  # the compute-instance profiles a GI of this profile offers

    @property
    def placements(self) -> tuple[tuple[int, int], ...]:
        """Every legal (start, size) placement, free or not."""
        return tuple((start, self.slices) for start in self.starts)


@dataclass(frozen=True, slots=True)
class DriverVariant:
    """A GI profile that some driver branches name or size differently from the table."""

    branches: frozenset[int]  # driver major versions (535, 545, ...) the variant applies to
    profile_id: int
    name: str | None = None  # None: the table's name
    memory_mib: int | None = None  # None: the table's size


@dataclass(frozen=True, slots=True)
class GpuModel:
    """Facts about one GPU product as NVML reports them."""

    key: str  # short catalog key, e.g. "a100-40"
    name: str  # nvmlDeviceGetName
    generation: str  # "ampere", "hopper", "blackwell", "ada", "turing"
    memory_mib: int  # nvmlDeviceGetMemoryInfo total, in MiB
    reserved_mib: int  # nvmlDeviceGetMemoryInfo_v2 "reserved": driver and firmware memory
    bar1_mib: int  # nvmlDeviceGetBAR1MemoryInfo total (the PCIe BAR1 aperture)
    pci_device_id: int  # combined device/vendor id
    pci_subsystem_id: int
    compute_capability: tuple[int, int]
    nvlinks: int  # NVLink ports per GPU (0 for PCIe-only parts)
    power_limit_w: int
    idle_power_w: int
    slowdown_c: int  # NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
    shutdown_c: int  # NVML_TEMPERATURE_THRESHOLD_SHUTDOWN
    gpu_max_c: int  # NVML_TEMPERATURE_THRESHOLD_GPU_MAX ("GPU Max Operating Temp")
    max_sm_clock_mhz: int
    max_mem_clock_mhz: int
    vbios: str
    memory_slices: int = 0  # 8 on A100/H100/H200/B200, 4 on A30, 0 when not MIG-capable
    gi_profiles: tuple[GiProfile, ...] = ()
    row_remapping: bool = True  # Ampere and newer remap rows; Turing retires pages
    driver_variants: tuple[DriverVariant, ...] = ()

    @property
    def mig_capable(self) -> bool:
        """Whether the model offers any MIG profile."""
        return bool(self.gi_profiles)

    @property
    def max_mig_devices(self) -> int:
        """Most MIG devices (compute instances) the GPU can hold: 7, or 4 on A30."""
        return max((p.compute_slices for p in self.gi_profiles), default=0)

    @property
    def engine_pool(self) -> tuple[int, int, int]:
        """(decoders, JPEG, OFA) the GPU has in all: those of its whole-GPU profile.

        GPU instances own their engines (MIG User Guide, "Concepts"), so the instances on a GPU
        can hold no more than the whole-GPU profile has. This is what keeps two "+me" instances
        apart where the GPU has one JPEG and one OFA (A30, A100).
        """
        full = max(self.gi_profiles, key=lambda p: p.compute_slices, default=None)
        if full is None:
            return 0, 0, 0
        return full.decoders, full.jpeg, full.ofa

    def profile_by_id(self, profile_id: int) -> GiProfile | None:
        """The GI profile with this NVML profile ID, or ``None``."""
        for profile in self.gi_profiles:
            if profile.profile_id == profile_id:
                return profile
        return None

    def profile_by_index(self, nvml_index: int) -> GiProfile | None:
        """The GI profile behind an ``NVML_GPU_INSTANCE_PROFILE_*`` constant, or ``None``."""
        for profile in self.gi_profiles:
            if profile.nvml_index == nvml_index:
                return profile
        return None

    def profile_by_name(self, name: str) -> GiProfile | None:
        """The GI profile with this name ("3g.40gb"), or ``None``."""
        for profile in self.gi_profiles:
            if profile.name == name:
                return profile
        return None

    def reported(self, profile: GiProfile, driver_version: str) -> tuple[str, int]:
        """(name, memory MiB) the driver ``driver_version`` reports for ``profile``."""
        branch = driver_branch(driver_version)
        name, memory = profile.name, profile.memory_mib
        for variant in self.driver_variants:
            if variant.profile_id == profile.profile_id and branch in variant.branches:
                name = variant.name or name
                memory = variant.memory_mib or memory
        return name, memory


def driver_branch(driver_version: str) -> int:
    """The branch (major version) of a driver version string: "570.124.06" -> 570."""
    head = driver_version.split(".", 1)[0]
    return int(head) if head.isdigit() else 0


# NVML index constants, spelled as pynvml spells them.
_P1 = pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE
_P1_ME = pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1  # "+me": one slice with media engines
_P1_2X = pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2  # one compute slice, twice the memory
_P2 = pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE
_P2_ME = pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1
_P3 = pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE
_P4 = pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE
_P7 = pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE

# --- compute-instance profiles ---------------------------------------------------------------

# NVML_COMPUTE_INSTANCE_PROFILE_* by SM-slice count (the plain profiles).
CI_PROFILE_BY_SLICES = {
    1: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
    2: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
    3: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
    4: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
    7: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
}
CI_1_SLICE_REV1 = pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1
CI_7_SLICE_NVL = pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE_NVL
CI_SLICES_BY_PROFILE = {v: k for k, v in CI_PROFILE_BY_SLICES.items()} | {
    CI_1_SLICE_REV1: 1,
    CI_7_SLICE_NVL: 7,
}

# CI profiles per GI compute size (the go-nvml mock tables for A100/H100, pkg/nvml/mock):
# c -> (max count, starts). Starts are SM-slice offsets inside the GI; a 3c on a 7g sits at 0
# or 4, like the 3g GI itself.
_CI_TABLE: dict[int, dict[int, tuple[int, tuple[int, ...]]]] = {
    1: {1: (1, (0,))},
    2: {1: (2, (0, 1)), 2: (1, (0,))},
    3: {1: (3, (0, 1, 2)), 2: (1, (0,)), 3: (1, (0,))},
    4: {1: (4, (0, 1, 2, 3)), 2: (2, (0, 2)), 4: (1, (0,))},
    7: {1: (7, (0, 1, 2, 3, 4, 5, 6)), 2: (3, (0, 2, 4)), 3: (2, (0, 4)), 4: (1, (0,)),
        7: (1, (0,))},
}  # fmt: skip


def _ci_table(nvml_index: int, compute_slices: int, generation: str) -> tuple[CiProfile, ...]:
    """The CI profiles a GI offers.

    * A "twice the memory" one-slice GI (1g.20gb on H100, 1g.10gb on A100-40GB) offers only
      CI profile 1_SLICE_REV1 (7), not 1_SLICE: H100 ``nvidia-smi mig -lcip`` as quoted in
      kubernetes-sigs/dra-driver-nvidia-gpu#1480 (the 1_SLICE / 1_SLICE_REV1 clash).
    * A whole-GPU GI on Ampere also lists 7_SLICE_NVL (8) beside 7_SLICE (4), same slices and
      placement (A100, dra-driver-nvidia-gpu#1480, 2026-09; not seen on other generations).
    """
    if nvml_index == _P1_2X:
        return (CiProfile(CI_1_SLICE_REV1, 1, 1, (0,)),)
    table = [
        CiProfile(CI_PROFILE_BY_SLICES[c], c, count, starts)
        for c, (count, starts) in sorted(_CI_TABLE.get(compute_slices, {}).items())
    ]
    if compute_slices == 7 and generation == "ampere":
        table.append(CiProfile(CI_7_SLICE_NVL, 7, 1, (0,)))
    return tuple(table)


# --- GPU-instance profile tables -------------------------------------------------------------

# Placement starts on the 8-memory-slice parts (real `nvidia-smi mig -lgipp` on A100/H100).
_S1 = (0, 1, 2, 3, 4, 5, 6)  # slot 7 is reachable only by 1g.2x@6 and 3g@4
_S1_2X = (0, 2, 4, 6)
_S2 = (0, 2, 4)
_S3 = (0, 4)  # a 3g occupies 4 memory slices
_S4 = (0,)
_S7 = (0,)

Engines = tuple[int, int, int, int]  # CE, DEC, JPEG, OFA
Seven = tuple[int, int, int, int, int, int, int]


def _eight_slice_profiles(
    names: tuple[str, str, str, str, str, str, str],
    sms: Seven,
    mib: Seven,
    engines: tuple[Engines, Engines, Engines, Engines, Engines, Engines, Engines],
    generation: str,
) -> tuple[GiProfile, ...]:
    """Profiles of an 8-slice part, in lgip order: 1g, 1g+me, 1g.2x, 2g, 3g, 4g, 7g.

    IDs, index constants, slice counts, max counts and placements are the same on every
    8-slice part (lgip on A100, H100, H200, GH200, B200, GB200); names, SM counts, memory and
    engines differ.
    """
    fixed = (
        # profile_id, nvml_index, memory slices, compute slices, max count, starts
        (19, _P1, 1, 1, 7, _S1),
        (20, _P1_ME, 1, 1, 1, _S1),
        (15, _P1_2X, 2, 1, 4, _S1_2X),
        (14, _P2, 2, 2, 3, _S2),
        (9, _P3, 4, 3, 2, _S3),
        (5, _P4, 4, 4, 1, _S4),
        (0, _P7, 8, 7, 1, _S7),
    )
    return tuple(
        GiProfile(
            name=name,
            profile_id=pid,
            nvml_index=index,
            slices=slices,
            compute_slices=compute,
            multiprocessors=sm,
            memory_mib=memory,
            max_count=max_count,
            copy_engines=ce,
            decoders=dec,
            jpeg=jpg,
            ofa=ofa,
            starts=starts,
            ci=_ci_table(index, compute, generation),
        )
        for name, sm, memory, (ce, dec, jpg, ofa), (
            pid,
            index,
            slices,
            compute,
            max_count,
            starts,
        ) in zip(names, sms, mib, engines, fixed, strict=True)
    )


def _gib(*values: float) -> Seven:
    """MiB from the GiB that ``nvidia-smi mig -lgip`` prints with two decimals.

    On the 8-slice parts every size NVML reports is a multiple of 1/8 GiB (all of the go-nvml
    A100 mock's memorySizeMB values are), so "9.62" is 9.625 GiB, 9856 MiB.
    """
    a, b, c, d, e, f, g = (round(v * 8) * 128 for v in values)
    return a, b, c, d, e, f, g


# Engines (CE, DEC, JPEG, OFA) per profile in lgip order.
_A100_ENGINES = ((1, 0, 0, 0), (1, 1, 1, 1), (1, 1, 0, 0), (2, 1, 0, 0), (3, 2, 0, 0),
                 (4, 2, 0, 0), (7, 5, 1, 1))  # fmt: skip
_HOPPER_ENGINES = ((1, 1, 1, 0), (1, 1, 1, 1), (1, 1, 1, 0), (2, 2, 2, 0), (3, 3, 3, 0),
                   (4, 4, 4, 0), (8, 7, 7, 1))  # fmt: skip
# Blackwell: 1g/1g+me/1g.2x/2g from lgip (mig-parted#166, gpu-operator#1303); 3g/4g/7g inferred
# by scaling the 2g row (CE 2 per compute slice, as 2g shows) and 7g from Hopper's 7/7/1.
_BLACKWELL_ENGINES = ((2, 1, 1, 0), (2, 1, 1, 1), (2, 1, 1, 0), (4, 2, 2, 0), (6, 3, 3, 0),
                      (8, 4, 4, 0), (16, 7, 7, 1))  # fmt: skip
_A100_SMS = (14, 14, 14, 28, 42, 56, 98)
_HOPPER_SMS = (16, 16, 26, 32, 60, 64, 132)  # 1g.2x has 26 SMs and 3g 60 (real lgip)

A100_40 = GpuModel(
    key="a100-40",
    name="NVIDIA A100-SXM4-40GB",
    generation="ampere",
    memory_mib=40960,
    reserved_mib=571,
    bar1_mib=65536,
    pci_device_id=0x20B010DE,
    pci_subsystem_id=0x134F10DE,
    compute_capability=(8, 0),
    nvlinks=12,
    power_limit_w=400,
    idle_power_w=55,
    slowdown_c=89,
    shutdown_c=92,
    gpu_max_c=85,
    max_sm_clock_mhz=1410,
    max_mem_clock_mhz=1215,
    vbios="92.00.45.00.03",
    memory_slices=8,
    gi_profiles=_eight_slice_profiles(
        ("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
        _A100_SMS,
        _gib(4.75, 4.75, 9.62, 9.62, 19.50, 19.50, 39.25),
        _A100_ENGINES,
        "ampere",
    ),
)

A100_80 = GpuModel(
    key="a100-80",
    name="NVIDIA A100-SXM4-80GB",
    generation="ampere",
    memory_mib=81920,
    reserved_mib=571,
    bar1_mib=131072,
    pci_device_id=0x20B210DE,
    pci_subsystem_id=0x147F10DE,
    compute_capability=(8, 0),
    nvlinks=12,
    power_limit_w=400,
    idle_power_w=60,
    slowdown_c=89,
    shutdown_c=92,
    gpu_max_c=85,
    max_sm_clock_mhz=1410,
    max_mem_clock_mhz=1593,
    vbios="92.00.36.00.02",
    memory_slices=8,
    gi_profiles=_eight_slice_profiles(
        ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
        _A100_SMS,
        _gib(9.50, 9.50, 19.50, 19.50, 39.25, 39.25, 78.50),
        _A100_ENGINES,
        "ampere",
    ),
    # R535 and R545 name the 3g profile "3g.39gb" (mig-parted#31, lgip on 545.23.08).
    driver_variants=(DriverVariant(frozenset({535, 545}), 9, name="3g.39gb"),),
)

H100_80 = GpuModel(
    key="h100-80",
    name="NVIDIA H100 80GB HBM3",
    generation="hopper",
    memory_mib=81559,
    reserved_mib=336,
    bar1_mib=131072,
    pci_device_id=0x233010DE,
    pci_subsystem_id=0x16C110DE,
    compute_capability=(9, 0),
    nvlinks=18,
    power_limit_w=700,
    idle_power_w=70,
    slowdown_c=89,
    shutdown_c=92,
    gpu_max_c=87,
    max_sm_clock_mhz=1980,
    max_mem_clock_mhz=2619,
    vbios="96.00.99.00.01",
    memory_slices=8,
    gi_profiles=_eight_slice_profiles(
        ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
        _HOPPER_SMS,
        _gib(9.75, 9.75, 19.62, 19.62, 39.50, 39.50, 79.25),
        _HOPPER_ENGINES,
        "hopper",
    ),
)

H100_PCIE = GpuModel(
    key="h100-pcie",
    name="NVIDIA H100 PCIe",
    generation="hopper",
    memory_mib=81559,
    reserved_mib=336,
    bar1_mib=131072,
    pci_device_id=0x233110DE,
    pci_subsystem_id=0x162610DE,
    compute_capability=(9, 0),
    nvlinks=0,  # the optional NVLink bridge is not modelled
    power_limit_w=350,
    idle_power_w=45,
    slowdown_c=89,
    shutdown_c=92,
    gpu_max_c=87,
    max_sm_clock_mhz=1755,
    max_mem_clock_mhz=1593,
    vbios="96.00.30.00.01",
    memory_slices=8,
    gi_profiles=_eight_slice_profiles(
        ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
        (14, 14, 22, 28, 52, 56, 114),  # inferred: the PCIe part has 114 SMs, not 132
        _gib(9.75, 9.75, 19.62, 19.62, 39.50, 39.50, 79.25),
        _HOPPER_ENGINES,
        "hopper",
    ),
)

H100_NVL = GpuModel(
    key="h100-nvl",
    name="NVIDIA H100 NVL",
    generation="hopper",
    memory_mib=95830,
    reserved_mib=336,
    bar1_mib=131072,
    pci_device_id=0x232110DE,
    pci_subsystem_id=0x183910DE,
    compute_capability=(9, 0),
    nvlinks=12,  # NVLink bridge to one peer: NV12
    power_limit_w=400,
    idle_power_w=60,
    slowdown_c=89,
    shutdown_c=92,
    gpu_max_c=87,
    max_sm_clock_mhz=1785,
    max_mem_clock_mhz=2619,
    vbios="96.00.74.00.0C",
    memory_slices=8,
    gi_profiles=_eight_slice_profiles(
        ("1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"),
        _HOPPER_SMS,
        _gib(10.75, 10.75, 21.62, 21.62, 46.38, 46.38, 93.12),
        _HOPPER_ENGINES,
        "hopper",
    ),
)

H200 = GpuModel(
    key="h200",
    name="NVIDIA H200",
    generation="hopper",
    memory_mib=143771,
    reserved_mib=700,
    bar1_mib=262144,
    pci_device_id=0x233510DE,
    pci_subsystem_id=0x18BE10DE,
    compute_capability=(9, 0),
    nvlinks=18,
    power_limit_w=700,
    idle_power_w=75,
    slowdown_c=89,
    shutdown_c=92,
    gpu_max_c=87,
    max_sm_clock_mhz=1980,
    max_mem_clock_mhz=3201,
    vbios="96.00.A5.00.03",
    memory_slices=8,
    gi_profiles=_eight_slice_profiles(
        ("1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
        _HOPPER_SMS,
        _gib(16.00, 16.00, 32.25, 32.25, 69.50, 69.50, 139.75),
        _HOPPER_ENGINES,
        "hopper",
    ),
)

H200_NVL = GpuModel(
    key="h200-nvl",
    name="NVIDIA H200 NVL",
    generation="hopper",
    memory_mib=143771,
    reserved_mib=700,
    bar1_mib=262144,
    pci_device_id=0x233B10DE,
    pci_subsystem_id=0x199610DE,
    compute_capability=(9, 0),
    nvlinks=18,  # NVLink bridge: every port to the bridged peers
    power_limit_w=600,
    idle_power_w=65,
    slowdown_c=89,
    shutdown_c=92,
    gpu_max_c=87,
    max_sm_clock_mhz=1785,
    max_mem_clock_mhz=3201,
    vbios="96.00.AF.00.01",
    memory_slices=8,
    gi_profiles=_eight_slice_profiles(
        ("1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
        _HOPPER_SMS,
        _gib(16.00, 16.00, 32.25, 32.25, 69.50, 69.50, 139.75),
        _HOPPER_ENGINES,
        "hopper",
    ),
)

GH200 = GpuModel(
    key="gh200",
    name="NVIDIA GH200 480GB",
    generation="hopper",
    memory_mib=97871,
    reserved_mib=336,
    bar1_mib=131072,
    pci_device_id=0x234210DE,
    pci_subsystem_id=0x16EB10DE,
    compute_capability=(9, 0),
    nvlinks=0,  # NVLink-C2C goes to the Grace CPU, not to GPU peers
    power_limit_w=900,
    idle_power_w=90,
    slowdown_c=89,
    shutdown_c=92,
    gpu_max_c=87,
    max_sm_clock_mhz=1980,
    max_mem_clock_mhz=2619,
    vbios="96.00.A1.00.01",
    memory_slices=8,
    gi_profiles=_eight_slice_profiles(
        ("1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"),
        _HOPPER_SMS,
        _gib(11.00, 11.00, 22.12, 22.12, 47.00, 47.00, 94.50),
        _HOPPER_ENGINES,
        "hopper",
    ),
)

B200 = GpuModel(
    key="b200",
    name="NVIDIA B200",
    generation="blackwell",
    memory_mib=183359,
    reserved_mib=830,
    bar1_mib=262144,
    pci_device_id=0x290110DE,
    pci_subsystem_id=0x199910DE,
    compute_capability=(10, 0),
    nvlinks=18,
    power_limit_w=1000,
    idle_power_w=140,
    slowdown_c=89,
    shutdown_c=92,
    gpu_max_c=87,
    max_sm_clock_mhz=1965,
    max_mem_clock_mhz=3996,
    vbios="97.00.88.00.0F",
    memory_slices=8,
    gi_profiles=_eight_slice_profiles(
        ("1g.23gb", "1g.23gb+me", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"),
        (18, 18, 30, 36, 60, 72, 144),
        _gib(20.50, 20.50, 44.25, 44.25, 89.50, 89.50, 178.50),
        _BLACKWELL_ENGINES,
        "blackwell",
    ),
)

GB200 = GpuModel(
    key="gb200",
    name="NVIDIA GB200",
    generation="blackwell",
    memory_mib=189471,
    reserved_mib=850,
    bar1_mib=262144,
    pci_device_id=0x294110DE,
    pci_subsystem_id=0x20CA10DE,
    compute_capability=(10, 0),
    nvlinks=18,
    power_limit_w=1200,
    idle_power_w=160,
    slowdown_c=89,
    shutdown_c=92,
    gpu_max_c=87,
    max_sm_clock_mhz=2062,
    max_mem_clock_mhz=3996,
    vbios="97.00.B9.00.01",
    memory_slices=8,
    gi_profiles=_eight_slice_profiles(
        ("1g.23gb", "1g.23gb+me", "1g.47gb", "2g.47gb", "3g.93gb", "4g.93gb", "7g.186gb"),
        (18, 18, 32, 38, 60, 76, 152),
        _gib(22.00, 22.00, 45.50, 45.50, 92.00, 92.00, 184.00),
        _BLACKWELL_ENGINES,
        "blackwell",
    ),
)

# A30: 4 memory slices. Placements are from the go-nvml mock (not seen on hardware).
_A30_S1 = (0, 1, 2, 3)
_A30_S2 = (0, 2)
A30 = GpuModel(
    key="a30",
    name="NVIDIA A30",
    generation="ampere",
    memory_mib=24576,
    reserved_mib=316,
    bar1_mib=32768,
    pci_device_id=0x20B710DE,
    pci_subsystem_id=0x153210DE,
    compute_capability=(8, 0),
    nvlinks=0,  # the optional NVLink bridge is not modelled
    power_limit_w=165,
    idle_power_w=30,
    slowdown_c=97,
    shutdown_c=100,
    gpu_max_c=90,
    max_sm_clock_mhz=1440,
    max_mem_clock_mhz=1215,
    vbios="92.00.66.00.01",
    memory_slices=4,
    gi_profiles=(
        GiProfile("1g.6gb", 14, _P1, 1, 1, 14, 5952, 4, 1, 0, 0, 0, _A30_S1,
                  ci=_ci_table(_P1, 1, "ampere")),
        GiProfile("1g.6gb+me", 21, _P1_ME, 1, 1, 14, 5952, 1, 1, 1, 1, 1, _A30_S1,
                  ci=_ci_table(_P1_ME, 1, "ampere")),
        GiProfile("2g.12gb", 5, _P2, 2, 2, 28, 11968, 2, 2, 2, 0, 0, _A30_S2,
                  ci=_ci_table(_P2, 2, "ampere")),
        GiProfile("2g.12gb+me", 6, _P2_ME, 2, 2, 28, 11968, 1, 2, 2, 1, 1, _A30_S2,
                  ci=_ci_table(_P2_ME, 2, "ampere")),
        GiProfile("4g.24gb", 0, _P4, 4, 4, 56, 24000, 1, 4, 4, 1, 1, (0,),
                  ci=_ci_table(_P4, 4, "ampere")),
    ),
)  # fmt: skip

L40S = GpuModel(
    key="l40s",
    name="NVIDIA L40S",
    generation="ada",
    memory_mib=46068,
    reserved_mib=462,
    bar1_mib=65536,
    pci_device_id=0x26B910DE,
    pci_subsystem_id=0x185110DE,
    compute_capability=(8, 9),
    nvlinks=0,
    power_limit_w=350,
    idle_power_w=35,
    slowdown_c=90,
    shutdown_c=95,
    gpu_max_c=85,
    max_sm_clock_mhz=2520,
    max_mem_clock_mhz=9001,
    vbios="95.02.66.00.02",
)

T4 = GpuModel(
    key="t4",
    name="Tesla T4",
    generation="turing",
    memory_mib=15360,
    reserved_mib=255,
    bar1_mib=256,
    pci_device_id=0x1EB810DE,
    pci_subsystem_id=0x12A210DE,
    compute_capability=(7, 5),
    nvlinks=0,
    power_limit_w=70,
    idle_power_w=10,
    slowdown_c=93,
    shutdown_c=96,
    gpu_max_c=85,
    max_sm_clock_mhz=1590,
    max_mem_clock_mhz=5001,
    vbios="90.04.96.00.02",
    row_remapping=False,  # Turing retires pages instead of remapping rows
)

MODELS: dict[str, GpuModel] = {m.key: m for m in (A100_40, A100_80, A30, H100_80, H100_PCIE,
                                                    H100_NVL, H200, H200_NVL, GH200, B200, GB200,
                                                    L40S, T4)}  # fmt: skip

# --- where each fact comes from ---------------------------------------------------------------
# Sources, by the facts they cover. The public outputs are GitHub issues and pull requests of
# NVIDIA's own projects and of users; "UG" is NVIDIA's MIG User Guide.
_UG_A100 = "UG 'Supported MIG Profiles' (A100) and lgip/lgipp in 'Getting Started'"
_LGIP_H100 = (
    "nvidia-smi mig -lgip on H100 80GB HBM3 (public field notes, jbarrow.ai; driver not shown)"
)
_LGIP_H100_NVL = (
    "nvidia-smi mig -lgip on H100 NVL (NVIDIA/gpu-operator#900, NVIDIA/mig-parted#101,"
    " 2024-07/08; driver not shown)"
)
_LGIP_H200 = "nvidia-smi mig -lgip on 8x H200 (NVIDIA/mig-parted#120; driver not shown)"
_LGIP_B200 = (
    "nvidia-smi mig -lgip on B200 (NVIDIA/mig-parted#166 2025-01: 1g 22.00 GiB; "
    "#187 2025-03: 1g 20.50 GiB, which the table uses; drivers not shown)"
)
_LGIP_GB200 = (
    "nvidia-smi mig -lgip on GB200 (NVIDIA/mig-parted#227, 2025-08: 1g.23gb 22.00 GiB; "
    "NVIDIA/gpu-operator#1303, 2025-03, named it 1g.24gb at 20.00 GiB; drivers not shown)"
)
_THRESHOLDS = (
    "nvidia-smi -q 'GPU Shutdown/Slowdown/Max Operating Temp' in public issues "
    "(e.g. Project-HAMi/HAMi#338; driver not shown)"
)
_PLACEMENT_RULE = (
    "UG 'Getting Started' examples (-cgi 9,19,14,19 and 14,19,19,19,19,19), public "
    "-lgi outputs (1g order 6,4,5,0..; 9,14 puts the 2g at 0:2; A100-80GB on "
    "550.54.14 created 4:4 first); the rule in ops.default_start"
)
_CI = (
    "go-nvml mock tables (A100/H100) for the plain CI profiles; 1_SLICE_REV1 in 1g.2x GIs and "
    "7_SLICE_NVL on Ampere 7g GIs: kubernetes-sigs/dra-driver-nvidia-gpu#1480"
)
_HOPPER_INFERRED_SM = "inferred: the H100 80GB SM counts, as the part has the same 132-SM die"

SOURCES: dict[str, dict[str, str]] = {
    "a100-40": {
        "identity": "UG 'Supported GPUs' PCI ids; A100 datasheet (40 GB HBM2, 400 W, NVLink 12)",
        "memory": "nvidia-smi -q: 40960 MiB total, BAR1 65536 MiB (NVIDIA/nvidia-docker#1648)",
        "reserved": "nvidia-smi -q 'Reserved: 571 MiB' (NVIDIA/nvidia-docker#1648)",
        "thresholds": _THRESHOLDS + ": slowdown 89, shutdown 92, max operating 85",
        "telemetry": "inferred: idle power, clocks, VBIOS and subsystem id are plausible values",
        "profiles": _UG_A100,
        "profile_memory": _UG_A100 + " (4.75/9.62/19.50/39.25 GiB)",
        "placements": "UG lgipp on A100-SXM4-40GB",
        "default_placement": _PLACEMENT_RULE,
        "ci_profiles": _CI,
    },
    "a100-80": {
        "identity": "UG 'Supported GPUs' PCI ids; NVIDIA A100 datasheet (80 GB HBM2e)",
        "memory": "nvidia-smi: 81920 MiB total (NVIDIA/mig-parted#31, driver 545.23.08)",
        "reserved": "inferred: the A100-40GB reading (571 MiB); no 80GB reading found",
        "bar1": "inferred: twice the 40GB part's 64 GiB aperture",
        "thresholds": _THRESHOLDS + ": slowdown 89, shutdown 92, max operating 85",
        "telemetry": "inferred: idle power, clocks, VBIOS and subsystem id are plausible values",
        "profiles": "lgip on A100-SXM4-80GB in public blogs; same IDs and slices as 40GB",
        "profile_memory": (
            "lgip on A100-SXM4-80GB (9.50/19.50/39.25/78.50 GiB); the 3g name on "
            "R535/R545 from NVIDIA/mig-parted#31 (545.23.08)"
        ),
        "placements": "lgipp on A100 in the UG (same geometry as the 40GB part)",
        "default_placement": _PLACEMENT_RULE,
        "ci_profiles": _CI,
    },
    "a30": {
        "identity": "UG 'Supported GPUs' (A30, 4 slices); NVIDIA A30 datasheet (24 GB, 165 W)",
        "memory": "inferred: 24 GiB as the profile table implies",
        "reserved": "inferred: a 24576 MiB part's 'Reserved: 316 MiB' (k8s-device-plugin#471)",
        "thresholds": _THRESHOLDS + ": slowdown 97, shutdown 100, max operating 90",
        "telemetry": "inferred: idle power, clocks, VBIOS and subsystem id are plausible values",
        "profiles": "UG A30 table and lgip in a public blog",
        "profile_memory": "UG A30 table (5.81/11.69/23.44 GiB)",
        "placements": "inferred: go-nvml mock a30.go (no lgipp seen on hardware)",
        "default_placement": "inferred: the 8-slice rule applied to 4 slices (no A30 output seen)",
        "ci_profiles": _CI,
        "media_engines": "UG A30 table: one JPEG and one OFA on the whole GPU",
    },
    "h100-80": {
        "identity": "UG 'Supported GPUs' PCI ids; nvidia-smi -q on H100 80GB HBM3 (0x233010DE)",
        "memory": "nvidia-smi -q 'Total: 81559 MiB', BAR1 131072 MiB (many public outputs)",
        "reserved": (
            "nvidia-smi -q 'Reserved: 336 MiB' on driver 550.90.07 (public log); other "
            "drivers show 328-551 MiB"
        ),
        "thresholds": _THRESHOLDS + ": slowdown 89, shutdown 92, max operating 87",
        "telemetry": "nvidia-smi -q on H100 80GB HBM3: 700 W limit, max clocks 1980/2619 MHz",
        "profiles": _LGIP_H100 + "; UG Table 7",
        "profile_memory": _LGIP_H100 + " (9.75/19.62/19.62/39.50/79.25 GiB)",
        "placements": "lgipp on H100 (a public GCP Dataproc init script, 2024-12)",
        "default_placement": _PLACEMENT_RULE,
        "ci_profiles": _CI,
    },
    "h100-pcie": {
        "identity": "UG 'Supported GPUs' (H100-PCIE-80GB 0x233110DE); H100 PCIe datasheet (350 W)",
        "memory": "inferred: same 80 GB HBM2e total as the SXM part reports",
        "reserved": "inferred: the H100 80GB HBM3 reading",
        "thresholds": "inferred: the H100 80GB HBM3 thresholds",
        "telemetry": "inferred: idle power, clocks, VBIOS and subsystem id are plausible values",
        "profiles": "names, IDs and slices as H100 80GB (UG Table 7 covers the H100 family)",
        "profile_memory": "inferred: the H100 80GB HBM3 lgip sizes",
        "sms": "inferred: the part has 114 SMs, so the SXM counts cannot hold; scaled per slice",
        "placements": "inferred: the H100 80GB lgipp",
        "default_placement": _PLACEMENT_RULE,
        "ci_profiles": _CI,
    },
    "h100-nvl": {
        "identity": "UG 'Supported GPUs' (H100 NVL 0x232110DE); mig-parted config-default.yaml",
        "memory": "nvidia-smi: 95830 MiB total; 7g.94gb at 93.12 GiB in lgip",
        "reserved": "inferred: the H100 80GB HBM3 reading",
        "thresholds": "inferred: the H100 80GB HBM3 thresholds",
        "telemetry": "inferred: idle power, clocks, VBIOS and subsystem id are plausible values",
        "profiles": _LGIP_H100_NVL,
        "profile_memory": _LGIP_H100_NVL + " (10.75/21.62/46.38 GiB; 7g 93.12)",
        "sms": _HOPPER_INFERRED_SM + " (lgip shows 16 and 26 and 32 for the small ones)",
        "placements": "lgipp identical to A100's (NVIDIA H100 NVL blog)",
        "default_placement": _PLACEMENT_RULE,
        "ci_profiles": _CI,
    },
    "h200": {
        "identity": "nvidia-smi -q on H200 (0x233510DE, 0x18BE10DE; driver 550.90.12, public log)",
        "memory": "nvidia-smi -q 'Total: 143771 MiB', BAR1 262144 MiB (550.90.12, public log)",
        "reserved": "nvidia-smi -q 'Reserved: 700 MiB' (driver 550.90.12, public log)",
        "thresholds": (
            "inferred: the H100 thresholds (R550 prints only T.Limit offsets for H200: "
            "shutdown -8, slowdown -2, max operating 0)"
        ),
        "telemetry": "nvidia-smi -q on H200 (550.90.12): 700 W, max clocks 1980/3201 MHz, VBIOS",
        "profiles": _LGIP_H200 + "; UG Table 8",
        "profile_memory": _LGIP_H200 + " (16.00/32.25/69.50/139.75 GiB)",
        "placements": "inferred: the 8-slice geometry (UG memory fractions; no lgipp seen)",
        "default_placement": _PLACEMENT_RULE,
        "ci_profiles": _CI,
    },
    "h200-nvl": {
        "identity": "mig-parted config-default.yaml (H200 NVL 0x233B10DE); 600 W datasheet",
        "memory": "inferred: the H200 SXM total",
        "reserved": "inferred: the H200 SXM reading",
        "thresholds": "inferred: the H100 thresholds",
        "telemetry": "inferred: idle power, clocks, VBIOS and subsystem id are plausible values",
        "profiles": _LGIP_H200 + " (mig-parted lists the same profiles for H200 NVL)",
        "profile_memory": "inferred: the H200 SXM lgip sizes",
        "placements": "inferred: the 8-slice geometry",
        "default_placement": _PLACEMENT_RULE,
        "ci_profiles": _CI,
    },
    "gh200": {
        "identity": (
            "mig-parted config-default.yaml (H100 96GB on GH200, 0x234210DE); public "
            "logs name it 'NVIDIA GH200 480GB', cc 9.0, 132 SMs (driver 580.105.08)"
        ),
        "memory": "inferred: about 97.8 GB reported (public log, driver 570.148.08)",
        "reserved": "inferred: the H100 80GB HBM3 reading",
        "thresholds": "inferred: the H100 thresholds",
        "telemetry": "inferred: 900 W is the superchip's module budget; the rest plausible values",
        "profiles": (
            "names from mig-parted config-default.yaml and a public provider's MIG page "
            "(1g.12gb ... 7g.96gb, 7g with 7 NVDEC/7 JPEG/1 OFA)"
        ),
        "profile_memory": "inferred: scaled from H100 NVL's lgip by the 96/94 GB ratio",
        "sms": _HOPPER_INFERRED_SM,
        "placements": "inferred: the 8-slice geometry",
        "default_placement": _PLACEMENT_RULE,
        "ci_profiles": _CI,
    },
    "b200": {
        "identity": (
            "nvidia-smi on 8x B200: 183359 MiB, 1000 W, driver 570.172.08 (public log); "
            "cc 10.0, 148 SMs; PCI id from mig-parted PR#166"
        ),
        "memory": "nvidia-smi: 183359 MiB (driver 570.172.08, public log)",
        "reserved": "inferred: about 0.45 % of memory, between H100's and H200's readings",
        "thresholds": "inferred: the H100 thresholds",
        "telemetry": "inferred: idle power, clocks, VBIOS and subsystem id are plausible values",
        "profiles": _LGIP_B200 + " for 1g, 1g+me, 1g.2x and 2g; names of 3g/4g/7g from "
        "mig-parted config-default.yaml",
        "profile_memory": _LGIP_B200 + "; 3g/4g/7g inferred (twice, twice, eight times 2g's less "
        "a slice's share)",
        "sms": "lgip: 1g 18, 1g.2x 30, 2g 36; 3g/4g/7g inferred (no lgip row seen)",
        "engines": "lgip for 1g..2g; 3g/4g/7g inferred",
        "placements": "inferred: the 8-slice geometry (UG memory fractions)",
        "default_placement": _PLACEMENT_RULE,
        "ci_profiles": "inferred: the Hopper CI tables",
    },
    "gb200": {
        "identity": (
            "nvidia-smi on GB200: 189471 MiB, 1200 W (public logs, driver 580.95.05); "
            "PCI id from gpu-operator#1303"
        ),
        "memory": "nvidia-smi: 189471 MiB (driver 580.95.05, public log)",
        "reserved": "inferred: about 0.45 % of memory",
        "thresholds": "inferred: the H100 thresholds",
        "telemetry": "inferred: idle power, clocks, VBIOS and subsystem id are plausible values",
        "profiles": _LGIP_GB200 + " for 1g, 1g+me, 1g.2x and 2g; 3g/4g/7g names from mig-parted "
        "config-default.yaml",
        "profile_memory": _LGIP_GB200 + "; 3g/4g/7g inferred",
        "sms": "lgip: 1g 18, 1g.2x 32, 2g 38; 3g/4g/7g inferred",
        "engines": "lgip for 1g..2g; 3g/4g/7g inferred",
        "placements": "inferred: the 8-slice geometry",
        "default_placement": _PLACEMENT_RULE,
        "ci_profiles": "inferred: the Hopper CI tables",
    },
    "l40s": {
        "identity": "NVIDIA L40S datasheet (48 GB GDDR6, 350 W, no MIG, no NVLink)",
        "memory": "inferred: 46068 MiB as nvidia-smi reports for 48 GB GDDR6 with ECC",
        "reserved": "inferred: about 1 % of memory",
        "thresholds": "inferred: typical Ada datacenter values (no reading found)",
        "telemetry": "inferred: idle power, clocks, VBIOS and subsystem id are plausible values",
    },
    "t4": {
        "identity": "NVIDIA T4 datasheet (16 GB GDDR6, 70 W, no MIG, no NVLink)",
        "memory": "inferred: 15360 MiB as nvidia-smi reports",
        "reserved": "inferred: a Turing part's few hundred MiB",
        "thresholds": "inferred: typical Turing datacenter values (no reading found)",
        "telemetry": "inferred: idle power, clocks, VBIOS and subsystem id are plausible values",
    },
}

for _key, _facts in SOURCES.items():
    if "BAR1" not in _facts["memory"]:
        _facts.setdefault("bar1", "inferred: the BAR1 aperture of the nearest modelled part")

# The facts every model names a source for, and those only MIG-capable ones have.
FACTS = ("identity", "memory", "reserved", "thresholds", "telemetry")
MIG_FACTS = ("profiles", "profile_memory", "placements", "default_placement", "ci_profiles")


def inferred_facts() -> list[tuple[str, str, str]]:
    """(model key, fact, reason) of every fact that is inferred rather than read somewhere."""
    return [
        (key, fact, text)
        for key, facts in SOURCES.items()
        for fact, text in facts.items()
        if "inferred" in text
    ]


def model(key: str) -> GpuModel:
    """The catalog entry for ``key``. Raises KeyError naming the known keys."""
    try:
        return MODELS[key]
    except KeyError:
        raise KeyError(f"unknown GPU model {key!r}; known: {', '.join(MODELS)}") from None


# --- compute instances ---------------------------------------------------------------------------


def ci_profiles(gi: GiProfile) -> tuple[CiProfile, ...]:
    """The compute-instance profiles a GPU instance of this profile offers."""
    return gi.ci


def ci_profile(gi: GiProfile, profile_id: int) -> CiProfile | None:
    """The CI profile ``profile_id`` inside a GI of profile ``gi``, or ``None``."""
    for ci in gi.ci:
        if ci.profile_id == profile_id:
            return ci
    return None


def ci_multiprocessors(gi: GiProfile, ci: CiProfile) -> int:
    """SMs of a CI: the GI's SMs split evenly by SM slice (inferred; no published table)."""
    if ci.slices == gi.compute_slices:
        return gi.multiprocessors
    return gi.multiprocessors // gi.compute_slices * ci.slices


def ci_name(gi: GiProfile, ci: CiProfile, gi_name: str | None = None) -> str:
    """``1c.3g.20gb``, or the GI's name when the CI spans the whole GI."""
    name = gi_name or gi.name
    if ci.slices == gi.compute_slices:
        return name
    return f"{ci.slices}c.{name}"


# --- GPU-instance IDs ----------------------------------------------------------------------------


def gi_id_range(total_slices: int, size: int) -> range:
    """The GPU-instance IDs the driver hands out to instances ``size`` memory slices large.

    Numbered like the levels of a binary tree over the memory slices: the whole GPU is 0, the
    halves' instances take 1-2, the quarters' 3-6 and the eighths' 7-14 (on a 4-slice A30: 0,
    1-2, 3-6). Every published ``-lgi`` keeps to these ranges (1g instances 7-13, 3g and 4g 1-2).
    """
    level_nodes = total_slices // size
    return range(level_nodes - 1, 2 * level_nodes - 1)


def gi_instance_id(total_slices: int, size: int, taken: Iterable[int]) -> int | None:
    """The ID a new instance of ``size`` slices gets: the lowest free one of its range.

    IDs follow creation, not placement: on an A100-80GB (driver 550.54.14) the 3g instance
    created first took ID 1 at 4:4 and the second ID 2 at 0:4. ``None`` when the range is full.
    """
    used = set(taken)
    return next((i for i in gi_id_range(total_slices, size) if i not in used), None)
