"""MIG facts of NVIDIA GPU models as the driver reports them, keyed by PCI device ID.

One owner for the profile tables that two layers need: the GPU layer falls back on them while
MIG is disabled (the driver answers ``nvmlDeviceGetGpuInstanceProfileInfo*`` with NOT_SUPPORTED
then, per nvml.h, so a layout could not be planned or validated before MIG is on), and the
simulator serves them through its NVML surface. It sits below both and imports neither.

The per-model facts are data, in ``migcatalog.yaml`` beside this module: one entry per model with
its PCI ids, memory, the columns its profile rows follow from and where each fact comes from,
read and checked once at import (a malformed file fails the import with :class:`CatalogError`,
naming the file and the bad key). The rules that turn those columns into rows stay here: the
profiles every 8-slice part shares, the name and MiB of a profile from its "<n>gb" and lgip GiB,
the compute-instance table. Every model names its sources in :data:`SOURCES`: NVIDIA's MIG User
Guide ("UG"), a public ``nvidia-smi mig -lgip/-lgipp`` output with its driver version where the
output shows one, or ``inferred: <reason>``. ``tests/sim/test_sim_catalog.py`` pins the tables
to those sources, against a copy of the published readings of its own.

Two integer spaces are kept apart here, as NVML keeps them apart:

* ``profile_id``: the device-specific GPU-instance profile ID (``info.id``; 19/20/15/14/9/5/0 on
  A100/H100/H200/B200, 14/21/5/6/0 on A30). Create, placement and capacity calls take this.
* ``nvml_index``: the ``NVML_GPU_INSTANCE_PROFILE_*`` constant passed to
  ``nvmlDeviceGetGpuInstanceProfileInfo`` to look a profile up.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib.resources import files
from typing import Annotated, ClassVar, Literal, Self, TypeVar

import pynvml
import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    field_validator,
    model_validator,
)

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


# --- the catalog file ----------------------------------------------------------------------------


class CatalogError(ValueError):
    """A catalog data file that does not hold what its schema says: names the file and each key."""

    def __init__(self, file: str, problems: Iterable[str]) -> None:
        super().__init__(f"{file}: " + "; ".join(problems))


_Schema = TypeVar("_Schema", bound=BaseModel)


def parse_catalog(file: str, text: str, schema: type[_Schema]) -> _Schema:
    """The YAML text of the catalog file ``file``, validated against ``schema``.

    Raises :class:`CatalogError` naming the file and, for every bad value, its key path
    (``models.a100-40.eight_slice.gib: ...``).
    """
    try:
        return schema.model_validate(yaml.safe_load(text))
    except yaml.YAMLError as exc:
        raise CatalogError(file, [f"not valid YAML: {exc}"]) from None
    except ValidationError as exc:
        raise CatalogError(
            file,
            [f"{'.'.join(map(str, e['loc'])) or 'top level'}: {e['msg']}" for e in exc.errors()],
        ) from None


_REFERENCE = re.compile(r"\{(\w+)\}")


def expand_references(file: str, where: str, text: str, references: Mapping[str, str]) -> str:
    """``text`` with every ``{name}`` replaced by the reference of that name."""
    unknown = sorted(set(_REFERENCE.findall(text)) - set(references))
    if unknown:
        raise CatalogError(file, [f"{where}: cites {unknown}, not in references"])
    return _REFERENCE.sub(lambda m: references[m.group(1)], text)


class CatalogSchema(BaseModel):
    """A part of a catalog file: every key known, every value of its own type.

    YAML sequences arrive as lists; the tuple fields take them (``Strict(False)`` on the tuple
    alone), their items stay strict.
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class SourcedEntry(CatalogSchema):
    """A catalog entry that names where its facts come from: ``required_facts`` at least."""

    required_facts: ClassVar[tuple[str, ...]] = ()
    sources: dict[str, str]

    @model_validator(mode="after")
    def _every_fact_sourced(self) -> Self:
        missing = [fact for fact in self.required_facts if fact not in self.sources]
        if missing:
            raise ValueError(f"sources lacks {missing}")
        return self


# The facts every model names a source for.
FACTS = ("pci_ids", "profiles", "profile_memory", "placements", "ci_profiles")
Generation = Literal["ampere", "hopper", "blackwell"]
_Ints = Annotated[tuple[int, ...], Strict(False), Field(min_length=1)]
_Engines = Annotated[tuple[int, int, int, int], Strict(False)]
_SevenSms = Annotated[Seven, Strict(False)]
_SevenEngines = Annotated[
    tuple[_Engines, _Engines, _Engines, _Engines, _Engines, _Engines, _Engines], Strict(False)
]


class _EightSlice(CatalogSchema):
    gb: Annotated[tuple[int, int, int, int], Strict(False)]
    gib: Annotated[BySize, Strict(False)]
    sms: str | _SevenSms  # a row of the file's ``sms`` or the model's own seven
    engines: str | _SevenEngines
    generation: Generation


class _ProfileRow(CatalogSchema):
    name: str
    profile_id: int
    nvml_index: str  # NVML_GPU_INSTANCE_PROFILE_<nvml_index>
    slices: int
    compute_slices: int
    multiprocessors: int
    memory_mib: int
    max_count: int
    engines: _Engines
    starts: _Ints

    @field_validator("nvml_index")
    @classmethod
    def _known_constant(cls, value: str) -> str:
        if not isinstance(getattr(pynvml, f"NVML_GPU_INSTANCE_PROFILE_{value}", None), int):
            raise ValueError(f"NVML_GPU_INSTANCE_PROFILE_{value} is not a pynvml constant")
        return value


class _Variant(CatalogSchema):
    branches: _Ints
    profile_id: int
    name: str | None = None
    memory_mib: int | None = None


class _MigEntry(SourcedEntry):
    required_facts = FACTS

    pci_device_ids: _Ints
    memory_mib: int
    eight_slice: _EightSlice | None = None
    memory_slices: int | None = None
    generation: Generation | None = None
    profiles: Annotated[tuple[_ProfileRow, ...], Strict(False)] = ()
    driver_variants: Annotated[tuple[_Variant, ...], Strict(False)] = ()

    @model_validator(mode="after")
    def _one_geometry(self) -> _MigEntry:
        explicit = {
            "memory_slices": self.memory_slices,
            "generation": self.generation,
            "profiles": self.profiles,
        }
        given = [name for name, value in explicit.items() if value]
        if given != ([] if self.eight_slice else list(explicit)):
            raise ValueError("give either eight_slice, or memory_slices, generation and profiles")
        return self


class _MigFile(CatalogSchema):
    references: dict[str, str]
    sms: dict[str, _SevenSms]
    engines: dict[str, _SevenEngines]
    models: dict[str, _MigEntry]


_Row = TypeVar("_Row")


def _shared(file: str, shared: Mapping[str, _Row], table: str, where: str, row: _Row | str) -> _Row:
    """A model's own row, or the row of the file's ``table`` that it names."""
    if not isinstance(row, str):
        return row
    if row not in shared:
        raise CatalogError(file, [f"{where}: no {table} row {row!r}; known: {sorted(shared)}"])
    return shared[row]


def _mig_model(file: str, catalog: _MigFile, key: str, entry: _MigEntry) -> MigModel:
    variants = tuple(
        DriverVariant(frozenset(v.branches), v.profile_id, v.name, v.memory_mib)
        for v in entry.driver_variants
    )
    if entry.eight_slice is not None:
        e, where = entry.eight_slice, f"models.{key}.eight_slice"
        sms = _shared(file, catalog.sms, "sms", f"{where}.sms", e.sms)
        engines = _shared(file, catalog.engines, "engines", f"{where}.engines", e.engines)
        profiles = _eight_slice_profiles(e.gb, e.gib, sms, engines, e.generation)
        return MigModel(key, entry.pci_device_ids, entry.memory_mib, 8, profiles, variants)
    # _one_geometry saw to these
    assert entry.memory_slices is not None
    assert entry.generation is not None
    rows = []
    for row in entry.profiles:
        index = getattr(pynvml, f"NVML_GPU_INSTANCE_PROFILE_{row.nvml_index}")
        ce, dec, jpg, ofa = row.engines
        fields = row.model_dump(exclude={"nvml_index", "engines"})
        ci = _ci_table(index, row.compute_slices, entry.generation)
        rows.append(
            GiProfile(
                **fields, nvml_index=index, copy_engines=ce, decoders=dec, jpeg=jpg, ofa=ofa, ci=ci
            )
        )
    return MigModel(
        key, entry.pci_device_ids, entry.memory_mib, entry.memory_slices, tuple(rows), variants
    )


def read_catalog(file: str, text: str) -> tuple[dict[str, MigModel], dict[str, dict[str, str]]]:
    """The models of a MIG catalog file, by key, and where each of their facts comes from."""
    catalog = parse_catalog(file, text, _MigFile)
    models = {key: _mig_model(file, catalog, key, e) for key, e in catalog.models.items()}
    sources = {
        key: {
            fact: expand_references(file, f"models.{key}.sources.{fact}", say, catalog.references)
            for fact, say in entry.sources.items()
        }
        for key, entry in catalog.models.items()
    }
    return models, sources


MODELS, SOURCES = read_catalog(
    "nodeagent/migcatalog.yaml",
    files("nodeagent").joinpath("migcatalog.yaml").read_text(encoding="utf-8"),
)

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
