"""GPU model catalog for the simulator: product facts, each model with its MIG geometry.

Pure data plus small lookups. Every fact names where it comes from in :data:`SOURCES`, one entry
per model and fact: a document (NVIDIA's MIG User Guide, a datasheet), a public ``nvidia-smi``
output with its driver version where the output shows one, or ``inferred: <reason>`` where no
public reading was found. ``tests/sim/test_catalog.py`` pins the tables to those sources and
docs/simulator.md lists what is inferred.

The MIG profile tables (profile IDs, ``NVML_GPU_INSTANCE_PROFILE_*`` index constants, slices, SMs,
memory, engines, placements, compute-instance profiles) are not kept here but in
:mod:`nodeagent.migcatalog`, which the agent's GPU layer reads too while MIG is disabled; their
sources are merged into :data:`SOURCES`. What is the simulator's own: product and telemetry facts,
where an instance goes without an explicit placement, and GPU-instance IDs, allocated per device
as instances are created (see ``gi_instance_id``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from nodeagent import migcatalog
from nodeagent.migcatalog import MIB, CiProfile, GiProfile, MigModel

# The catalog's types, used throughout the simulator under this module's name.
__all__ = ["MIB", "MODELS", "SOURCES", "CiProfile", "GiProfile", "GpuModel", "model"]


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
    mig: MigModel | None = None  # the MIG geometry (nodeagent.migcatalog); None: no MIG
    row_remapping: bool = True  # Ampere and newer remap rows; Turing retires pages

    @property
    def gi_profiles(self) -> tuple[GiProfile, ...]:
        """The GPU-instance profiles, in lgip order (none without MIG)."""
        return self.mig.profiles if self.mig is not None else ()

    @property
    def memory_slices(self) -> int:
        """8 on A100/H100/H200/B200, 4 on A30, 0 when not MIG-capable."""
        return self.mig.memory_slices if self.mig is not None else 0

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
        return self.mig.profile_by_id(profile_id) if self.mig is not None else None

    def profile_by_index(self, nvml_index: int) -> GiProfile | None:
        """The GI profile behind an ``NVML_GPU_INSTANCE_PROFILE_*`` constant, or ``None``."""
        return self.mig.profile_by_index(nvml_index) if self.mig is not None else None

    def profile_by_name(self, name: str) -> GiProfile | None:
        """The GI profile with this name ("3g.40gb"), or ``None``."""
        return self.mig.profile_by_name(name) if self.mig is not None else None

    def reported(self, profile: GiProfile, driver_version: str) -> tuple[str, int]:
        """(name, memory MiB) the driver ``driver_version`` reports for ``profile``."""
        assert self.mig is not None, f"{self.key} has no MIG profiles"
        return self.mig.reported(profile, driver_version)


# Thresholds (slowdown, shutdown, max operating °C) read on A100 and H100; the models without a
# reading of their own take the H100's (see SOURCES).
_A100_THRESHOLDS_C = (89, 92, 85)
_H100_THRESHOLDS_C = (89, 92, 87)


def _model(
    key: str,
    name: str,
    generation: str,
    compute_capability: tuple[int, int],
    *,
    mib: tuple[int, int, int],
    pci: tuple[int, int],
    nvlinks: int,
    power_w: tuple[int, int],
    thresholds_c: tuple[int, int, int],
    clocks_mhz: tuple[int, int],
    vbios: str,
    mig: MigModel | None = None,
    row_remapping: bool = True,
) -> GpuModel:
    """A catalog entry from its facts grouped as the table below writes them.

    ``mib``: total, reserved and BAR1 memory; ``pci``: device and subsystem id; ``power_w``:
    limit and idle draw; ``thresholds_c``: slowdown, shutdown and max operating temperature;
    ``clocks_mhz``: max SM and memory clock.
    """
    memory_mib, reserved_mib, bar1_mib = mib
    slowdown_c, shutdown_c, gpu_max_c = thresholds_c
    return GpuModel(
        key=key,
        name=name,
        generation=generation,
        memory_mib=memory_mib,
        reserved_mib=reserved_mib,
        bar1_mib=bar1_mib,
        pci_device_id=pci[0],
        pci_subsystem_id=pci[1],
        compute_capability=compute_capability,
        nvlinks=nvlinks,
        power_limit_w=power_w[0],
        idle_power_w=power_w[1],
        slowdown_c=slowdown_c,
        shutdown_c=shutdown_c,
        gpu_max_c=gpu_max_c,
        max_sm_clock_mhz=clocks_mhz[0],
        max_mem_clock_mhz=clocks_mhz[1],
        vbios=vbios,
        mig=mig,
        row_remapping=row_remapping,
    )


# fmt: off
MODELS: dict[str, GpuModel] = {m.key: m for m in (
    _model("a100-40", "NVIDIA A100-SXM4-40GB", "ampere", (8, 0), mib=(40960, 571, 65536),
           pci=(0x20B010DE, 0x134F10DE), nvlinks=12, power_w=(400, 55),
           thresholds_c=_A100_THRESHOLDS_C, clocks_mhz=(1410, 1215), vbios="92.00.45.00.03",
           mig=migcatalog.A100_40),
    _model("a100-80", "NVIDIA A100-SXM4-80GB", "ampere", (8, 0), mib=(81920, 571, 131072),
           pci=(0x20B210DE, 0x147F10DE), nvlinks=12, power_w=(400, 60),
           thresholds_c=_A100_THRESHOLDS_C, clocks_mhz=(1410, 1593), vbios="92.00.36.00.02",
           mig=migcatalog.A100_80),
    # The optional NVLink bridge is not modelled.
    _model("a30", "NVIDIA A30", "ampere", (8, 0), mib=(24576, 316, 32768),
           pci=(0x20B710DE, 0x153210DE), nvlinks=0, power_w=(165, 30),
           thresholds_c=(97, 100, 90), clocks_mhz=(1440, 1215), vbios="92.00.66.00.01",
           mig=migcatalog.A30),
    _model("h100-80", "NVIDIA H100 80GB HBM3", "hopper", (9, 0), mib=(81559, 336, 131072),
           pci=(0x233010DE, 0x16C110DE), nvlinks=18, power_w=(700, 70),
           thresholds_c=_H100_THRESHOLDS_C, clocks_mhz=(1980, 2619), vbios="96.00.99.00.01",
           mig=migcatalog.H100_80),
    # The optional NVLink bridge is not modelled.
    _model("h100-pcie", "NVIDIA H100 PCIe", "hopper", (9, 0), mib=(81559, 336, 131072),
           pci=(0x233110DE, 0x162610DE), nvlinks=0, power_w=(350, 45),
           thresholds_c=_H100_THRESHOLDS_C, clocks_mhz=(1755, 1593), vbios="96.00.30.00.01",
           mig=migcatalog.H100_PCIE),
    # NVLink bridge to one peer: NV12.
    _model("h100-nvl", "NVIDIA H100 NVL", "hopper", (9, 0), mib=(95830, 336, 131072),
           pci=(0x232110DE, 0x183910DE), nvlinks=12, power_w=(400, 60),
           thresholds_c=_H100_THRESHOLDS_C, clocks_mhz=(1785, 2619), vbios="96.00.74.00.0C",
           mig=migcatalog.H100_NVL),
    _model("h200", "NVIDIA H200", "hopper", (9, 0), mib=(143771, 700, 262144),
           pci=(0x233510DE, 0x18BE10DE), nvlinks=18, power_w=(700, 75),
           thresholds_c=_H100_THRESHOLDS_C, clocks_mhz=(1980, 3201), vbios="96.00.A5.00.03",
           mig=migcatalog.H200),
    # NVLink bridge: every port to the bridged peers.
    _model("h200-nvl", "NVIDIA H200 NVL", "hopper", (9, 0), mib=(143771, 700, 262144),
           pci=(0x233B10DE, 0x199610DE), nvlinks=18, power_w=(600, 65),
           thresholds_c=_H100_THRESHOLDS_C, clocks_mhz=(1785, 3201), vbios="96.00.AF.00.01",
           mig=migcatalog.H200_NVL),
    # NVLink-C2C goes to the Grace CPU, not to GPU peers.
    _model("gh200", "NVIDIA GH200 480GB", "hopper", (9, 0), mib=(97871, 336, 131072),
           pci=(0x234210DE, 0x16EB10DE), nvlinks=0, power_w=(900, 90),
           thresholds_c=_H100_THRESHOLDS_C, clocks_mhz=(1980, 2619), vbios="96.00.A1.00.01",
           mig=migcatalog.GH200),
    _model("b200", "NVIDIA B200", "blackwell", (10, 0), mib=(183359, 830, 262144),
           pci=(0x290110DE, 0x199910DE), nvlinks=18, power_w=(1000, 140),
           thresholds_c=_H100_THRESHOLDS_C, clocks_mhz=(1965, 3996), vbios="97.00.88.00.0F",
           mig=migcatalog.B200),
    _model("gb200", "NVIDIA GB200", "blackwell", (10, 0), mib=(189471, 850, 262144),
           pci=(0x294110DE, 0x20CA10DE), nvlinks=18, power_w=(1200, 160),
           thresholds_c=_H100_THRESHOLDS_C, clocks_mhz=(2062, 3996), vbios="97.00.B9.00.01",
           mig=migcatalog.GB200),
    _model("l40s", "NVIDIA L40S", "ada", (8, 9), mib=(46068, 462, 65536),
           pci=(0x26B910DE, 0x185110DE), nvlinks=0, power_w=(350, 35),
           thresholds_c=(90, 95, 85), clocks_mhz=(2520, 9001), vbios="95.02.66.00.02"),
    # Turing retires pages instead of remapping rows.
    _model("t4", "Tesla T4", "turing", (7, 5), mib=(15360, 255, 256),
           pci=(0x1EB810DE, 0x12A210DE), nvlinks=0, power_w=(70, 10),
           thresholds_c=(93, 96, 85), clocks_mhz=(1590, 5001), vbios="90.04.96.00.02",
           row_remapping=False),
)}
# fmt: on

# --- where each fact comes from ---------------------------------------------------------------
# Sources, by the facts they cover. The public outputs are GitHub issues and pull requests of
# NVIDIA's own projects and of users; "UG" is NVIDIA's MIG User Guide.
_THRESHOLDS = (
    "nvidia-smi -q 'GPU Shutdown/Slowdown/Max Operating Temp' in public issues "
    "(e.g. Project-HAMi/HAMi#338; driver not shown)"
)
_PLACEMENT_RULE = (
    "UG 'Getting Started' examples (-cgi 9,19,14,19 and 14,19,19,19,19,19), public "
    "-lgi outputs (1g order 6,4,5,0..; 9,14 puts the 2g at 0:2; A100-80GB on "
    "550.54.14 created 4:4 first); the rule in ops.default_start"
)

SOURCES: dict[str, dict[str, str]] = {
    "a100-40": {
        "identity": "UG 'Supported GPUs' PCI ids; A100 datasheet (40 GB HBM2, 400 W, NVLink 12)",
        "memory": "nvidia-smi -q: 40960 MiB total, BAR1 65536 MiB (NVIDIA/nvidia-docker#1648)",
        "reserved": "nvidia-smi -q 'Reserved: 571 MiB' (NVIDIA/nvidia-docker#1648)",
        "thresholds": _THRESHOLDS + ": slowdown 89, shutdown 92, max operating 85",
        "telemetry": "inferred: idle power, clocks, VBIOS and subsystem id are plausible values",
        "default_placement": _PLACEMENT_RULE,
    },
    "a100-80": {
        "identity": "UG 'Supported GPUs' PCI ids; NVIDIA A100 datasheet (80 GB HBM2e)",
        "memory": "nvidia-smi: 81920 MiB total (NVIDIA/mig-parted#31, driver 545.23.08)",
        "reserved": "inferred: the A100-40GB reading (571 MiB); no 80GB reading found",
        "bar1": "inferred: twice the 40GB part's 64 GiB aperture",
        "thresholds": _THRESHOLDS + ": slowdown 89, shutdown 92, max operating 85",
        "telemetry": "inferred: idle power, clocks, VBIOS and subsystem id are plausible values",
        "default_placement": _PLACEMENT_RULE,
    },
    "a30": {
        "identity": "UG 'Supported GPUs' (A30, 4 slices); NVIDIA A30 datasheet (24 GB, 165 W)",
        "memory": "inferred: 24 GiB as the profile table implies",
        "reserved": "inferred: a 24576 MiB part's 'Reserved: 316 MiB' (k8s-device-plugin#471)",
        "thresholds": _THRESHOLDS + ": slowdown 97, shutdown 100, max operating 90",
        "telemetry": "inferred: idle power, clocks, VBIOS and subsystem id are plausible values",
        "default_placement": "inferred: the 8-slice rule applied to 4 slices (no A30 output seen)",
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
        "default_placement": _PLACEMENT_RULE,
    },
    "h100-pcie": {
        "identity": "UG 'Supported GPUs' (H100-PCIE-80GB 0x233110DE); H100 PCIe datasheet (350 W)",
        "memory": "inferred: same 80 GB HBM2e total as the SXM part reports",
        "reserved": "inferred: the H100 80GB HBM3 reading",
        "thresholds": "inferred: the H100 80GB HBM3 thresholds",
        "telemetry": "inferred: idle power, clocks, VBIOS and subsystem id are plausible values",
        "default_placement": _PLACEMENT_RULE,
    },
    "h100-nvl": {
        "identity": "UG 'Supported GPUs' (H100 NVL 0x232110DE); mig-parted config-default.yaml",
        "memory": "nvidia-smi: 95830 MiB total; 7g.94gb at 93.12 GiB in lgip",
        "reserved": "inferred: the H100 80GB HBM3 reading",
        "thresholds": "inferred: the H100 80GB HBM3 thresholds",
        "telemetry": "inferred: idle power, clocks, VBIOS and subsystem id are plausible values",
        "default_placement": _PLACEMENT_RULE,
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
        "default_placement": _PLACEMENT_RULE,
    },
    "h200-nvl": {
        "identity": "mig-parted config-default.yaml (H200 NVL 0x233B10DE); 600 W datasheet",
        "memory": "inferred: the H200 SXM total",
        "reserved": "inferred: the H200 SXM reading",
        "thresholds": "inferred: the H100 thresholds",
        "telemetry": "inferred: idle power, clocks, VBIOS and subsystem id are plausible values",
        "default_placement": _PLACEMENT_RULE,
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
        "default_placement": _PLACEMENT_RULE,
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
        "default_placement": _PLACEMENT_RULE,
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
        "default_placement": _PLACEMENT_RULE,
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
    # The MIG tables' sources live with the tables, in the shared catalog.
    _facts.update(migcatalog.SOURCES.get(_key, {}))

# The facts every model names a source for, and those only MIG-capable ones have.
FACTS = ("identity", "memory", "reserved", "thresholds", "telemetry")
MIG_FACTS = (*migcatalog.FACTS, "default_placement")


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
