"""GPU model catalog for the simulator: product facts, each model with its MIG geometry.

The facts of each model are data, in ``models.yaml`` beside this module (one entry per model,
its facts and their sources side by side), read and checked once at import; a malformed file
fails the import with :class:`~nodeagent.migcatalog.CatalogError`, naming the file and the bad
key. This module holds the types, the rules and small lookups. Every fact names where it comes
from in :data:`SOURCES`, one entry per model and fact: a document (NVIDIA's MIG User Guide, a
datasheet), a public ``nvidia-smi`` output with its driver version where the output shows one,
or ``inferred: <reason>`` where no public reading was found. ``tests/sim/test_sim_catalog.py``
pins the tables to those sources and docs/simulator.md lists what is inferred.

The MIG profile tables (profile IDs, ``NVML_GPU_INSTANCE_PROFILE_*`` index constants, slices, SMs,
memory, engines, placements, compute-instance profiles) are not kept here but in
:mod:`nodeagent.migcatalog` (``migcatalog.yaml``), which the agent's GPU layer reads too while MIG
is disabled; a model's geometry is the entry of the same key there, and their sources are merged
into :data:`SOURCES`. What is the simulator's own: product and telemetry facts, where an instance
goes without an explicit placement, and GPU-instance IDs, allocated per device as instances are
created (see ``gi_instance_id``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from importlib.resources import files
from typing import Annotated, Literal

from pydantic import Strict

from nodeagent import migcatalog
from nodeagent.migcatalog import (
    MIB,
    CatalogError,
    CatalogSchema,
    CiProfile,
    GiProfile,
    MigModel,
    SourcedEntry,
    expand_references,
    parse_catalog,
)

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


# --- the catalog file (models.yaml) ------------------------------------------------------------

# The facts every model names a source for, and those only MIG-capable ones have.
FACTS = ("identity", "memory", "reserved", "thresholds", "telemetry")
MIG_FACTS = (*migcatalog.FACTS, "default_placement")


class _ModelEntry(SourcedEntry):
    """One model of models.yaml: the fields of :class:`GpuModel` but its key and MIG geometry."""

    required_facts = FACTS

    name: str
    generation: Literal["ampere", "hopper", "blackwell", "ada", "turing"]
    compute_capability: Annotated[tuple[int, int], Strict(False)]
    memory_mib: int
    reserved_mib: int
    bar1_mib: int
    pci_device_id: int
    pci_subsystem_id: int
    nvlinks: int
    power_limit_w: int
    idle_power_w: int
    slowdown_c: int
    shutdown_c: int
    gpu_max_c: int
    max_sm_clock_mhz: int
    max_mem_clock_mhz: int
    vbios: str
    row_remapping: bool = True


class _ModelsFile(CatalogSchema):
    references: dict[str, str]
    models: dict[str, _ModelEntry]


def read_catalog(file: str, text: str) -> tuple[dict[str, GpuModel], dict[str, dict[str, str]]]:
    """The models of a catalog file, by key, and where each of their facts comes from.

    A model's MIG geometry is the :mod:`nodeagent.migcatalog` entry of the same key; every entry
    there must have its model here.
    """
    catalog = parse_catalog(file, text, _ModelsFile)
    if unmatched := sorted(set(migcatalog.MODELS) - set(catalog.models)):
        raise CatalogError(file, [f"models: no entry for the MIG models {unmatched}"])
    models = {
        key: GpuModel(
            key=key, mig=migcatalog.MODELS.get(key), **entry.model_dump(exclude={"sources"})
        )
        for key, entry in catalog.models.items()
    }
    sources: dict[str, dict[str, str]] = {}
    for key, entry in catalog.models.items():
        facts = sources[key] = {
            fact: expand_references(file, f"models.{key}.sources.{fact}", say, catalog.references)
            for fact, say in entry.sources.items()
        }
        if "BAR1" not in facts["memory"]:
            facts.setdefault("bar1", "inferred: the BAR1 aperture of the nearest modelled part")
        # The MIG tables' sources live with the tables, in the shared catalog.
        facts.update(migcatalog.SOURCES.get(key, {}))
    return models, sources


MODELS, SOURCES = read_catalog(
    "nodeagent/sim/models.yaml",
    files("nodeagent.sim").joinpath("models.yaml").read_text(encoding="utf-8"),
)


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
