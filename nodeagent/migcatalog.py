"""MIG facts of NVIDIA GPU models as the driver reports them, keyed by PCI device ID.

One owner for the profile tables that two layers need: the GPU layer falls back on them while
MIG is disabled (the driver answers ``nvmlDeviceGetGpuInstanceProfileInfo*`` with NOT_SUPPORTED
then, per nvml.h, so a layout could not be planned or validated before MIG is on), and the
simulator serves them through its NVML surface. It sits below both and imports neither.

Pure data plus small lookups. Every table names where it comes from in :data:`SOURCES`: NVIDIA's
MIG User Guide ("UG"), a public ``nvidia-smi mig -lgip/-lgipp`` output with its driver version
where the output shows one, or ``inferred: <reason>``. ``tests/sim/test_catalog.py`` pins the
tables to those sources.

Two integer spaces are kept apart here, as NVML keeps them apart:

* ``profile_id``: the device-specific GPU-instance profile ID (``info.id``; 19/20/15/14/9/5/0 on
  A100/H100/H200/B200, 14/21/5/6/0 on A30). Create, placement and capacity calls take this.
* ``nvml_index``: the ``NVML_GPU_INSTANCE_PROFILE_*`` constant passed to
  ``nvmlDeviceGetGpuInstanceProfileInfo`` to look a profile up.
"""

from __future__ import annotations

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


def driver_branch(driver_version: str) -> int:
    """The branch (major version) of a driver version string: "570.124.06" -> 570."""
    head = driver_version.split(".", 1)[0]
    return int(head) if head.isdigit() else 0


@dataclass(frozen=True, slots=True)
class MigModel:
    """The MIG geometry of one GPU product: what ``nvidia-smi mig -lgip/-lgipp`` shows."""

    key: str  # the simulator's model key, e.g. "h100-80"
    pci_device_ids: tuple[int, ...]  # combined device/vendor ids (nvmlPciInfo_t.pciDeviceId)
    # nvmlDeviceGetMemoryInfo total in MiB: tells apart SKUs that share a device ID
    memory_mib: int
    memory_slices: int  # 8 on A100/H100/H200/B200, 4 on A30
    profiles: tuple[GiProfile, ...]
    driver_variants: tuple[DriverVariant, ...] = ()

    def profile_by_id(self, profile_id: int) -> GiProfile | None:
        """The GI profile with this NVML profile ID, or ``None``."""
        return next((p for p in self.profiles if p.profile_id == profile_id), None)

    def profile_by_index(self, nvml_index: int) -> GiProfile | None:
        """The GI profile behind an ``NVML_GPU_INSTANCE_PROFILE_*`` constant, or ``None``."""
        return next((p for p in self.profiles if p.nvml_index == nvml_index), None)

    def profile_by_name(self, name: str) -> GiProfile | None:
        """The GI profile with this name ("3g.40gb"), or ``None``."""
        return next((p for p in self.profiles if p.name == name), None)

    def reported(self, profile: GiProfile, driver_version: str) -> tuple[str, int]:
        """(name, memory MiB) the driver ``driver_version`` reports for ``profile``."""
        branch = driver_branch(driver_version)
        name, memory = profile.name, profile.memory_mib
        for variant in self.driver_variants:
            if variant.profile_id == profile.profile_id and branch in variant.branches:
                name = variant.name or name
                memory = variant.memory_mib or memory
        return name, memory


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
BySize = tuple[float, float, float, float]  # per instance size: 1, 2, 4 and 8 memory slices

# The profiles of every 8-slice part, in lgip order: 1g, 1g+me, 1g.2x, 2g, 3g, 4g, 7g. IDs, index
# constants, slice counts, max counts and placements are the same on every one of them (lgip on
# A100, H100, H200, GH200, B200, GB200); names, SM counts, memory and engines differ.
_EIGHT_SLICE_FIXED = (
    # profile_id, nvml_index, memory slices, compute slices, max count, starts, name suffix
    (19, _P1, 1, 1, 7, _S1, ""),
    (20, _P1_ME, 1, 1, 1, _S1, "+me"),
    (15, _P1_2X, 2, 1, 4, _S1_2X, ""),
    (14, _P2, 2, 2, 3, _S2, ""),
    (9, _P3, 4, 3, 2, _S3, ""),
    (5, _P4, 4, 4, 1, _S4, ""),
    (0, _P7, 8, 7, 1, _S7, ""),
)
_SIZE_INDEX = {1: 0, 2: 1, 4: 2, 8: 3}  # memory slices -> position in a BySize


def _eight_slice_profiles(
    gb: tuple[int, int, int, int],
    gib: BySize,
    sms: Seven,
    engines: tuple[Engines, Engines, Engines, Engines, Engines, Engines, Engines],
    generation: str,
) -> tuple[GiProfile, ...]:
    """The profiles of an 8-slice part.

    A profile's name and memory follow from its memory slices: ``gb`` is the "<n>gb" of its name
    and ``gib`` the size ``nvidia-smi mig -lgip`` prints with two decimals, each for instances of
    1, 2, 4 and 8 slices. Every size NVML reports on these parts is a multiple of 1/8 GiB (all of
    the go-nvml A100 mock's memorySizeMB values are), so "9.62" is 9.625 GiB, 9856 MiB.
    """
    return tuple(
        GiProfile(
            name=f"{compute}g.{gb[_SIZE_INDEX[slices]]}gb{suffix}",
            profile_id=pid,
            nvml_index=index,
            slices=slices,
            compute_slices=compute,
            multiprocessors=sm,
            memory_mib=round(gib[_SIZE_INDEX[slices]] * 8) * 128,
            max_count=count,
            copy_engines=ce,
            decoders=dec,
            jpeg=jpg,
            ofa=ofa,
            starts=starts,
            ci=_ci_table(index, compute, generation),
        )
        for (pid, index, slices, compute, count, starts, suffix), sm, (ce, dec, jpg, ofa) in zip(
            _EIGHT_SLICE_FIXED, sms, engines, strict=True
        )
    )


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

_H200_PROFILES = _eight_slice_profiles(
    (18, 35, 71, 141), (16.00, 32.25, 69.50, 139.75), _HOPPER_SMS, _HOPPER_ENGINES, "hopper"
)

# fmt: off
# key, PCI device ids, total memory MiB, memory slices; the profiles from: the "<n>gb" and the
# lgip GiB of instances of 1, 2, 4 and 8 slices, SMs and engines per profile, the generation.
A100_40 = MigModel("a100-40", (0x20B010DE, 0x20F110DE), 40960, 8, _eight_slice_profiles(
    (5, 10, 20, 40), (4.75, 9.62, 19.50, 39.25), _A100_SMS, _A100_ENGINES, "ampere"))
A100_80 = MigModel("a100-80", (0x20B210DE, 0x20B510DE), 81920, 8, _eight_slice_profiles(
    (10, 20, 40, 80), (9.50, 19.50, 39.25, 78.50), _A100_SMS, _A100_ENGINES, "ampere"),
    # R535 and R545 name the 3g profile "3g.39gb" (mig-parted#31, lgip on 545.23.08).
    driver_variants=(DriverVariant(frozenset({535, 545}), 9, name="3g.39gb"),))
H100_80 = MigModel("h100-80", (0x233010DE,), 81559, 8, _eight_slice_profiles(
    (10, 20, 40, 80), (9.75, 19.62, 39.50, 79.25), _HOPPER_SMS, _HOPPER_ENGINES, "hopper"))
# Inferred: the PCIe part has 114 SMs, not 132.
H100_PCIE = MigModel("h100-pcie", (0x233110DE,), 81559, 8, _eight_slice_profiles(
    (10, 20, 40, 80), (9.75, 19.62, 39.50, 79.25), (14, 14, 22, 28, 52, 56, 114),
    _HOPPER_ENGINES, "hopper"))
H100_NVL = MigModel("h100-nvl", (0x232110DE,), 95830, 8, _eight_slice_profiles(
    (12, 24, 47, 94), (10.75, 21.62, 46.38, 93.12), _HOPPER_SMS, _HOPPER_ENGINES, "hopper"))
H200 = MigModel("h200", (0x233510DE,), 143771, 8, _H200_PROFILES)
H200_NVL = MigModel("h200-nvl", (0x233B10DE,), 143771, 8, _H200_PROFILES)
# The H100 96GB of a GH200 superchip.
GH200 = MigModel("gh200", (0x234210DE,), 97871, 8, _eight_slice_profiles(
    (12, 24, 48, 96), (11.00, 22.12, 47.00, 94.50), _HOPPER_SMS, _HOPPER_ENGINES, "hopper"))
B200 = MigModel("b200", (0x290110DE,), 183359, 8, _eight_slice_profiles(
    (23, 45, 90, 180), (20.50, 44.25, 89.50, 178.50), (18, 18, 30, 36, 60, 72, 144),
    _BLACKWELL_ENGINES, "blackwell"))
GB200 = MigModel("gb200", (0x294110DE,), 189471, 8, _eight_slice_profiles(
    (23, 47, 93, 186), (22.00, 45.50, 92.00, 184.00), (18, 18, 32, 38, 60, 76, 152),
    _BLACKWELL_ENGINES, "blackwell"))
# fmt: on

# A30: 4 memory slices. Placements are from the go-nvml mock (not seen on hardware).
_A30_S1 = (0, 1, 2, 3)
_A30_S2 = (0, 2)
A30 = MigModel(
    key="a30",
    pci_device_ids=(0x20B710DE,),
    memory_mib=24576,
    memory_slices=4,
    profiles=(
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

MODELS: dict[str, MigModel] = {
    m.key: m
    for m in (A100_40, A100_80, A30, H100_80, H100_PCIE, H100_NVL, H200, H200_NVL, GH200, B200,
              GB200)
}  # fmt: skip

# One SKU's total moves by a few MiB between drivers; SKUs that share a device ID differ by
# whole memory stacks (tens of percent), so 2 % tells them apart without rejecting a driver's
# rounding.
MEMORY_TOLERANCE = 0.02


def lookup(pci_device_id: int, memory_mib: int) -> MigModel | None:
    """The catalog entry of a GPU, or ``None`` for a product the catalog does not have.

    The device ID selects the candidates; of those, the one whose total memory is nearest, and
    within :data:`MEMORY_TOLERANCE`, is the GPU's. A GPU whose memory matches no candidate is an
    unknown SKU: no geometry is better than another product's.
    """
    candidates = [
        m
        for m in MODELS.values()
        if pci_device_id in m.pci_device_ids
        and abs(memory_mib - m.memory_mib) <= m.memory_mib * MEMORY_TOLERANCE
    ]
    return min(candidates, key=lambda m: abs(memory_mib - m.memory_mib), default=None)


# --- where each table comes from ----------------------------------------------------------------
# The public outputs are GitHub issues and pull requests of NVIDIA's own projects and of users;
# "UG" is NVIDIA's MIG User Guide.
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
_CI = (
    "go-nvml mock tables (A100/H100) for the plain CI profiles; 1_SLICE_REV1 in 1g.2x GIs and "
    "7_SLICE_NVL on Ampere 7g GIs: kubernetes-sigs/dra-driver-nvidia-gpu#1480"
)
_HOPPER_INFERRED_SM = "inferred: the H100 80GB SM counts, as the part has the same 132-SM die"
_UG_IDS = "UG 'Supported GPUs' PCI device ids"

SOURCES: dict[str, dict[str, str]] = {
    "a100-40": {
        "pci_ids": _UG_IDS + " (A100-SXM4-40GB 0x20B0, A100-PCIE-40GB 0x20F1: one table)",
        "profiles": _UG_A100,
        "profile_memory": _UG_A100 + " (4.75/9.62/19.50/39.25 GiB)",
        "placements": "UG lgipp on A100-SXM4-40GB",
        "ci_profiles": _CI,
    },
    "a100-80": {
        "pci_ids": _UG_IDS + " (A100-SXM4-80GB 0x20B2, A100 80GB PCIe 0x20B5: one table)",
        "profiles": "lgip on A100-SXM4-80GB in public blogs; same IDs and slices as 40GB",
        "profile_memory": (
            "lgip on A100-SXM4-80GB (9.50/19.50/39.25/78.50 GiB); the 3g name on "
            "R535/R545 from NVIDIA/mig-parted#31 (545.23.08)"
        ),
        "placements": "lgipp on A100 in the UG (same geometry as the 40GB part)",
        "ci_profiles": _CI,
    },
    "a30": {
        "pci_ids": _UG_IDS + " (A30 0x20B7, 4 slices)",
        "profiles": "UG A30 table and lgip in a public blog",
        "profile_memory": "UG A30 table (5.81/11.69/23.44 GiB)",
        "placements": "inferred: go-nvml mock a30.go (no lgipp seen on hardware)",
        "ci_profiles": _CI,
        "media_engines": "UG A30 table: one JPEG and one OFA on the whole GPU",
    },
    "h100-80": {
        "pci_ids": _UG_IDS + "; nvidia-smi -q on H100 80GB HBM3 (0x233010DE)",
        "profiles": _LGIP_H100 + "; UG Table 7",
        "profile_memory": _LGIP_H100 + " (9.75/19.62/19.62/39.50/79.25 GiB)",
        "placements": "lgipp on H100 (a public GCP Dataproc init script, 2024-12)",
        "ci_profiles": _CI,
    },
    "h100-pcie": {
        "pci_ids": _UG_IDS + " (H100-PCIE-80GB 0x233110DE)",
        "profiles": "names, IDs and slices as H100 80GB (UG Table 7 covers the H100 family)",
        "profile_memory": "inferred: the H100 80GB HBM3 lgip sizes",
        "sms": "inferred: the part has 114 SMs, so the SXM counts cannot hold; scaled per slice",
        "placements": "inferred: the H100 80GB lgipp",
        "ci_profiles": _CI,
    },
    "h100-nvl": {
        "pci_ids": _UG_IDS + " (H100 NVL 0x232110DE); mig-parted config-default.yaml",
        "profiles": _LGIP_H100_NVL,
        "profile_memory": _LGIP_H100_NVL + " (10.75/21.62/46.38 GiB; 7g 93.12)",
        "sms": _HOPPER_INFERRED_SM + " (lgip shows 16 and 26 and 32 for the small ones)",
        "placements": "lgipp identical to A100's (NVIDIA H100 NVL blog)",
        "ci_profiles": _CI,
    },
    "h200": {
        "pci_ids": "nvidia-smi -q on H200 (0x233510DE; driver 550.90.12, public log)",
        "profiles": _LGIP_H200 + "; UG Table 8",
        "profile_memory": _LGIP_H200 + " (16.00/32.25/69.50/139.75 GiB)",
        "placements": "inferred: the 8-slice geometry (UG memory fractions; no lgipp seen)",
        "ci_profiles": _CI,
    },
    "h200-nvl": {
        "pci_ids": "mig-parted config-default.yaml device filters (H200 NVL 0x233B10DE)",
        "profiles": _LGIP_H200 + " (mig-parted lists the same profiles for H200 NVL)",
        "profile_memory": "inferred: the H200 SXM lgip sizes",
        "placements": "inferred: the 8-slice geometry",
        "ci_profiles": _CI,
    },
    "gh200": {
        "pci_ids": "mig-parted config-default.yaml device filters (H100 96GB on GH200, 0x2342)",
        "profiles": (
            "names from mig-parted config-default.yaml and a public provider's MIG page "
            "(1g.12gb ... 7g.96gb, 7g with 7 NVDEC/7 JPEG/1 OFA)"
        ),
        "profile_memory": "inferred: scaled from H100 NVL's lgip by the 96/94 GB ratio",
        "sms": _HOPPER_INFERRED_SM,
        "placements": "inferred: the 8-slice geometry",
        "ci_profiles": _CI,
    },
    "b200": {
        "pci_ids": "mig-parted PR#166 device filter (B200 0x290110DE)",
        "profiles": _LGIP_B200 + " for 1g, 1g+me, 1g.2x and 2g; names of 3g/4g/7g from "
        "mig-parted config-default.yaml",
        "profile_memory": _LGIP_B200 + "; 3g/4g/7g inferred (twice, twice, eight times 2g's less "
        "a slice's share)",
        "sms": "lgip: 1g 18, 1g.2x 30, 2g 36; 3g/4g/7g inferred (no lgip row seen)",
        "engines": "lgip for 1g..2g; 3g/4g/7g inferred",
        "placements": "inferred: the 8-slice geometry (UG memory fractions)",
        "ci_profiles": "inferred: the Hopper CI tables",
    },
    "gb200": {
        "pci_ids": "NVIDIA/gpu-operator#1303 device filter (GB200 0x294110DE)",
        "profiles": _LGIP_GB200 + " for 1g, 1g+me, 1g.2x and 2g; 3g/4g/7g names from mig-parted "
        "config-default.yaml",
        "profile_memory": _LGIP_GB200 + "; 3g/4g/7g inferred",
        "sms": "lgip: 1g 18, 1g.2x 32, 2g 38; 3g/4g/7g inferred",
        "engines": "lgip for 1g..2g; 3g/4g/7g inferred",
        "placements": "inferred: the 8-slice geometry",
        "ci_profiles": "inferred: the Hopper CI tables",
    },
}

# The facts every table names a source for.
FACTS = ("pci_ids", "profiles", "profile_memory", "placements", "ci_profiles")
