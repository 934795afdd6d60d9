"""GPU model catalog for the simulator: product facts and MIG profile tables.

Pure data plus small lookups. The numbers come from the reference notes on MIG (NVIDIA's MIG
User Guide tables and real ``nvidia-smi mig -lgip`` / ``-lgipp`` output); where the notes mark a
value as inferred, the comment next to it says so.

Three integer spaces are kept apart here, as NVML keeps them apart:

* ``profile_id``: the device-specific GPU-instance profile ID (``info.id``; 19/20/15/14/9/5/0 on
  A100/H100/H200, 14/21/5/6/0 on A30). Create, placement and capacity calls take this.
* ``nvml_index``: the ``NVML_GPU_INSTANCE_PROFILE_*`` constant passed to
  ``nvmlDeviceGetGpuInstanceProfileInfo`` to look a profile up.
* GPU-instance IDs, allocated per device when an instance is created (see ``gi_instance_id``).
"""

from __future__ import annotations

from dataclasses import dataclass

import pynvml

MIB = 1024 * 1024


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

    @property
    def placements(self) -> tuple[tuple[int, int], ...]:
        """Every legal (start, size) placement, free or not."""
        return tuple((start, self.slices) for start in self.starts)


@dataclass(frozen=True, slots=True)
class CiProfile:
    """A compute-instance profile available inside a GPU instance of a given size."""

    profile_id: int  # NVML_COMPUTE_INSTANCE_PROFILE_* value (nvidia-smi prints the same)
    slices: int  # SM slices: the "c" in "1c.3g.20gb"
    max_count: int
    starts: tuple[int, ...]  # legal starts in SM-slice units, relative to the GI


@dataclass(frozen=True, slots=True)
class GpuModel:
    """Facts about one GPU product as NVML reports them."""

    key: str  # short catalog key, e.g. "a100-40"
    name: str  # nvmlDeviceGetName
    memory_mib: int  # nvmlDeviceGetMemoryInfo total, in MiB
    pci_device_id: int  # combined device/vendor id
    pci_subsystem_id: int
    compute_capability: tuple[int, int]
    nvlinks: int  # NVLink ports per GPU (0 for PCIe-only parts)
    power_limit_w: int
    idle_power_w: int
    slowdown_c: int  # NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
    shutdown_c: int
    max_sm_clock_mhz: int
    max_mem_clock_mhz: int
    vbios: str
    memory_slices: int = 0  # 8 on A100/H100/H200, 4 on A30, 0 when not MIG-capable
    gi_profiles: tuple[GiProfile, ...] = ()
    row_remapping: bool = True  # Ampere and newer remap rows; Turing retires pages

    @property
    def mig_capable(self) -> bool:
        """Whether the model offers any MIG profile."""
        return bool(self.gi_profiles)

    @property
    def max_mig_devices(self) -> int:
        """Most MIG devices (compute instances) the GPU can hold: 7, or 4 on A30."""
        return max((p.compute_slices for p in self.gi_profiles), default=0)

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


# NVML index constants, spelled as pynvml spells them.
_P1 = pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE
_P1_ME = pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1  # "+me": one slice with media engines
_P1_2X = pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2  # one compute slice, twice the memory
_P2 = pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE
_P2_ME = pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1
_P3 = pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE
_P4 = pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE
_P7 = pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE

# Placement starts on the 8-memory-slice parts (real `nvidia-smi mig -lgipp` on A100/H100).
_S1 = (0, 1, 2, 3, 4, 5, 6)  # slot 7 is reachable only by 1g.2x@6 and 3g@4
_S1_2X = (0, 2, 4, 6)
_S2 = (0, 2, 4)
_S3 = (0, 4)  # a 3g occupies 4 memory slices
_S4 = (0,)
_S7 = (0,)


def _eight_slice_profiles(
    names: tuple[str, str, str, str, str, str, str],
    sms: tuple[int, int, int, int, int, int, int],
    mib: tuple[int, int, int, int, int, int, int],
    engines: tuple[tuple[int, int, int, int], ...],
) -> tuple[GiProfile, ...]:
    """Profiles of an 8-slice part, in lgip order: 1g, 1g+me, 1g.2x, 2g, 3g, 4g, 7g.

    IDs, index constants, slice counts, max counts and placements are the same on every
    8-slice part; names, SM counts, memory and engines differ.
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


# Engines (CE, DEC, JPEG, OFA) per profile in lgip order.
_A100_ENGINES = ((1, 0, 0, 0), (1, 1, 1, 1), (1, 1, 0, 0), (2, 1, 0, 0), (3, 2, 0, 0),
                 (4, 2, 0, 0), (7, 5, 1, 1))  # fmt: skip
_HOPPER_ENGINES = ((1, 1, 1, 0), (1, 1, 1, 1), (1, 1, 1, 0), (2, 2, 2, 0), (3, 3, 3, 0),
                   (4, 4, 4, 0), (8, 7, 7, 1))  # fmt: skip
_A100_SMS = (14, 14, 14, 28, 42, 56, 98)
_HOPPER_SMS = (16, 16, 26, 32, 60, 64, 132)  # 1g.2x has 26 SMs and 3g 60 (real lgip)

A100_40 = GpuModel(
    key="a100-40",
    name="NVIDIA A100-SXM4-40GB",
    memory_mib=40960,
    pci_device_id=0x20B010DE,
    pci_subsystem_id=0x134F10DE,
    compute_capability=(8, 0),
    nvlinks=12,
    power_limit_w=400,
    idle_power_w=55,
    slowdown_c=92,
    shutdown_c=97,
    max_sm_clock_mhz=1410,
    max_mem_clock_mhz=1215,
    vbios="92.00.45.00.03",
    memory_slices=8,
    gi_profiles=_eight_slice_profiles(
        ("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
        _A100_SMS,
        (4864, 4864, 9856, 9856, 19968, 19968, 40192),
        _A100_ENGINES,
    ),
)

A100_80 = GpuModel(
    key="a100-80",
    name="NVIDIA A100-SXM4-80GB",
    memory_mib=81920,
    pci_device_id=0x20B210DE,
    pci_subsystem_id=0x147F10DE,
    compute_capability=(8, 0),
    nvlinks=12,
    power_limit_w=400,
    idle_power_w=60,
    slowdown_c=92,
    shutdown_c=97,
    max_sm_clock_mhz=1410,
    max_mem_clock_mhz=1593,
    vbios="92.00.36.00.02",
    memory_slices=8,
    gi_profiles=_eight_slice_profiles(
        ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
        _A100_SMS,
        (9856, 9856, 19968, 19968, 40192, 40192, 80384),
        _A100_ENGINES,
    ),
)

H100_80 = GpuModel(
    key="h100-80",
    name="NVIDIA H100 80GB HBM3",
    memory_mib=81559,
    pci_device_id=0x233010DE,
    pci_subsystem_id=0x16C110DE,
    compute_capability=(9, 0),
    nvlinks=18,
    power_limit_w=700,
    idle_power_w=70,
    slowdown_c=92,
    shutdown_c=97,
    max_sm_clock_mhz=1980,
    max_mem_clock_mhz=2619,
    vbios="96.00.99.00.01",
    memory_slices=8,
    gi_profiles=_eight_slice_profiles(
        ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
        _HOPPER_SMS,
        # 9.75 / 19.50 / 19.62 / 39.50 / 79.25 GiB as lgip prints them
        (9984, 9984, 19968, 20096, 40448, 40448, 81152),
        _HOPPER_ENGINES,
    ),
)

H100_NVL = GpuModel(
    key="h100-nvl",
    name="NVIDIA H100 NVL",
    memory_mib=95830,
    pci_device_id=0x232110DE,
    pci_subsystem_id=0x183910DE,
    compute_capability=(9, 0),
    nvlinks=12,  # NVLink bridge to one peer: NV12
    power_limit_w=400,
    idle_power_w=60,
    slowdown_c=92,
    shutdown_c=97,
    max_sm_clock_mhz=1785,
    max_mem_clock_mhz=2619,
    vbios="96.00.74.00.0C",
    memory_slices=8,
    gi_profiles=_eight_slice_profiles(
        ("1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"),
        _HOPPER_SMS,  # inferred: the notes presume the H100-80GB SM counts
        # 7g: 93.12 GiB (verified); the smaller sizes are inferred from the profile names
        (11776, 11776, 23808, 23808, 47616, 47616, 95360),
        _HOPPER_ENGINES,
    ),
)

H200 = GpuModel(
    key="h200",
    name="NVIDIA H200",
    memory_mib=143771,
    pci_device_id=0x233510DE,
    pci_subsystem_id=0x18BE10DE,
    compute_capability=(9, 0),
    nvlinks=18,
    power_limit_w=700,
    idle_power_w=75,
    slowdown_c=92,
    shutdown_c=97,
    max_sm_clock_mhz=1980,
    max_mem_clock_mhz=3201,
    vbios="96.00.A5.00.01",
    memory_slices=8,  # inferred: same 8-slice geometry as H100 (no lgipp seen)
    gi_profiles=_eight_slice_profiles(
        ("1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
        _HOPPER_SMS,
        # 16.00 / 32.25 / 69.50 / 140.00 GiB as lgip prints them
        (16384, 16384, 33024, 33024, 71168, 71168, 143360),
        _HOPPER_ENGINES,
    ),
)

# A30: 4 memory slices. Placements are from the go-nvml mock (not seen on hardware).
A30 = GpuModel(
    key="a30",
    name="NVIDIA A30",
    memory_mib=24576,
    pci_device_id=0x20B710DE,
    pci_subsystem_id=0x153210DE,
    compute_capability=(8, 0),
    nvlinks=0,  # the optional NVLink bridge is not modelled
    power_limit_w=165,
    idle_power_w=30,
    slowdown_c=90,
    shutdown_c=95,
    max_sm_clock_mhz=1440,
    max_mem_clock_mhz=1215,
    vbios="92.00.66.00.01",
    memory_slices=4,
    gi_profiles=(
        GiProfile("1g.6gb", 14, _P1, 1, 1, 14, 5952, 4, 1, 0, 0, 0, (0, 1, 2, 3)),
        GiProfile("1g.6gb+me", 21, _P1_ME, 1, 1, 14, 5952, 1, 1, 1, 1, 1, (0, 1, 2, 3)),
        GiProfile("2g.12gb", 5, _P2, 2, 2, 28, 11968, 2, 2, 2, 0, 0, (0, 2)),
        GiProfile("2g.12gb+me", 6, _P2_ME, 2, 2, 28, 11968, 1, 2, 2, 1, 1, (0, 2)),
        GiProfile("4g.24gb", 0, _P4, 4, 4, 56, 24000, 1, 4, 4, 1, 1, (0,)),
    ),
)

L40S = GpuModel(
    key="l40s",
    name="NVIDIA L40S",
    memory_mib=46068,
    pci_device_id=0x26B910DE,
    pci_subsystem_id=0x185110DE,
    compute_capability=(8, 9),
    nvlinks=0,
    power_limit_w=350,
    idle_power_w=35,
    slowdown_c=90,
    shutdown_c=95,
    max_sm_clock_mhz=2520,
    max_mem_clock_mhz=9001,
    vbios="95.02.66.00.02",
)

T4 = GpuModel(
    key="t4",
    name="Tesla T4",
    memory_mib=15360,
    pci_device_id=0x1EB810DE,
    pci_subsystem_id=0x12A210DE,
    compute_capability=(7, 5),
    nvlinks=0,
    power_limit_w=70,
    idle_power_w=10,
    slowdown_c=93,
    shutdown_c=96,
    max_sm_clock_mhz=1590,
    max_mem_clock_mhz=5001,
    vbios="90.04.96.00.02",
    row_remapping=False,  # Turing retires pages instead of remapping rows
)

MODELS: dict[str, GpuModel] = {m.key: m for m in (A100_40, A100_80, A30, H100_80, H100_NVL, H200,
                                                    L40S, T4)}  # fmt: skip


def model(key: str) -> GpuModel:
    """The catalog entry for ``key``. Raises KeyError naming the known keys."""
    try:
        return MODELS[key]
    except KeyError:
        raise KeyError(f"unknown GPU model {key!r}; known: {', '.join(MODELS)}") from None


# --- compute instances ---------------------------------------------------------------------------

# CI profiles per GI compute size (the A100/H100 table in the notes): c -> (max count, starts).
# Starts are SM-slice offsets inside the GI; 3c on a 7g sits at 0 or 4, like the 3g GI itself.
_CI_TABLE: dict[int, dict[int, tuple[int, tuple[int, ...]]]] = {
    1: {1: (1, (0,))},
    2: {1: (2, (0, 1)), 2: (1, (0,))},
    3: {1: (3, (0, 1, 2)), 2: (1, (0,)), 3: (1, (0,))},
    4: {1: (4, (0, 1, 2, 3)), 2: (2, (0, 2)), 4: (1, (0,))},
    7: {1: (7, (0, 1, 2, 3, 4, 5, 6)), 2: (3, (0, 2, 4)), 3: (2, (0, 4)), 4: (1, (0,)),
        7: (1, (0,))},
}  # fmt: skip

# NVML_COMPUTE_INSTANCE_PROFILE_* by SM-slice count.
CI_PROFILE_BY_SLICES = {
    1: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
    2: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
    3: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
    4: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
    7: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
}
CI_SLICES_BY_PROFILE = {v: k for k, v in CI_PROFILE_BY_SLICES.items()}


def ci_profiles(gi: GiProfile) -> tuple[CiProfile, ...]:
    """The compute-instance profiles a GPU instance of this profile offers."""
    table = _CI_TABLE.get(gi.compute_slices, {})
    return tuple(
        CiProfile(CI_PROFILE_BY_SLICES[c], c, count, starts)
        for c, (count, starts) in sorted(table.items())
    )


def ci_profile(gi: GiProfile, profile_id: int) -> CiProfile | None:
    """The CI profile ``profile_id`` inside a GI of profile ``gi``, or ``None``."""
    for ci in ci_profiles(gi):
        if ci.profile_id == profile_id:
            return ci
    return None


def ci_multiprocessors(gi: GiProfile, ci: CiProfile) -> int:
    """SMs of a CI: the GI's SMs split evenly by SM slice (inferred; the notes give none)."""
    if ci.slices == gi.compute_slices:
        return gi.multiprocessors
    return gi.multiprocessors // gi.compute_slices * ci.slices


def ci_name(gi: GiProfile, ci: CiProfile) -> str:
    """``1c.3g.20gb``, or the GI's name when the CI spans the whole GI."""
    if ci.slices == gi.compute_slices:
        return gi.name
    return f"{ci.slices}c.{gi.name}"


def gi_instance_id(total_slices: int, start: int, size: int) -> int:
    """The GPU-instance ID the simulator gives an instance at (start, size).

    Rule: number the slice tree like a binary heap. The whole GPU is 0, its halves 1 and 2,
    quarters 3..6, eighths 7..14 (on a 4-slice A30: whole 0, halves 1-2, quarters 3-6). An
    instance gets the number of the node its placement covers. This reproduces what real
    H100/A100 output shows for 1g instances (IDs 7..13 at slots 0..6) and gives every
    placement a fixed ID; the driver's numbering of larger instances is not consistent across
    the published examples, so no rule matches all of them.
    """
    level_nodes = total_slices // size  # nodes at this level of the tree
    return level_nodes - 1 + start // size
