"""mig-parted v1 layout files and hooks files: strict parsing and validation against a node.

The layout format is mig-parted's ``version: v1`` file, accepted unchanged::

    version: v1
    mig-configs:
      all-balanced:
        - device-filter: ["0x233010DE"]   # optional: PCI device id(s)
          devices: all                    # or a list of GPU indices
          mig-enabled: true
          mig-devices: {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}

Both formats are schema models read by :mod:`nodeagent.config.loader` (the one mechanism for
every file nodeagent reads), so every problem is reported at once with its file, line and field:
structure (unknown fields, wrong types, unknown version) in :func:`parse_config`, and what
depends on the node (profiles the GPU model offers, counts, placements, selectors) in
:func:`resolve`. Both raise :class:`~nodeagent.config.errors.ConfigError`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import AfterValidator, BeforeValidator, Field, field_validator, model_validator

from nodeagent.capacity import rank_order
from nodeagent.config.errors import ConfigError, FieldError, FieldPath, Problem, dotted
from nodeagent.config.loader import Schema, validate_document
from nodeagent.config.yamlfile import Document, parse_document, read_document
from nodeagent.gpu.protocols import GpuInventory
from nodeagent.gpu.types import MigGeometry
from nodeagent_mig.planner import check_layout

VERSION = "v1"
DEFAULT_CONFIG_FILE = Path(__file__).with_name("default-config.yaml")
HOOK_NAMES = ("apply-start", "pre-apply-mode", "pre-apply-config", "apply-exit")
LAYOUT_KIND = "a MIG layout file (mig-parted v1)"
HOOKS_KIND = "a MIG hooks file (mig-parted hooks v1)"


def _all_or_indices(value: Any) -> Any:
    """``devices``: ``all`` (None here) or a non-empty list of GPU indices."""
    if value == "all":
        return None
    if isinstance(value, list):
        if not value:
            raise ValueError("empty list; name GPU indices or use `all`")
        return value
    raise ValueError("expected `all` or a list of GPU indices like [0, 1]")


def _pci_id(raw: Any) -> int:
    value = None
    if isinstance(raw, str) and raw.lower().startswith("0x"):
        try:
            value = int(raw, 16)
        except ValueError:
            value = None
    if value is None or not 0 < value <= 0xFFFFFFFF:
        raise ValueError(f'{raw!r} is not a PCI device id like "0x233010DE"')
    return value


def _one_or_many(value: Any) -> Any:
    return value if isinstance(value, list) else [value]


def _empty_map(value: Any) -> Any:
    return {} if value is None else value  # `mig-devices:` with nothing under it


def _without_zeros(counts: dict[str, int]) -> dict[str, int]:
    """Zero counts mean "none of this profile": dropped once, here."""
    if counts and not any(counts.values()):
        raise ValueError("every count is 0; remove it or give a count")
    return {k: v for k, v in counts.items() if v}


GpuIndex = Annotated[int, Field(strict=True, ge=0)]
Count = Annotated[int, Field(strict=True, ge=0)]
PciId = Annotated[int, BeforeValidator(_pci_id)]


class DeviceSpec(Schema):
    """One entry of a named layout: which GPUs, MIG on or off, and the profile counts."""

    devices: Annotated[tuple[GpuIndex, ...] | None, BeforeValidator(_all_or_indices)] = Field(
        description="`all` (None) or a list of GPU indices"
    )
    mig_enabled: bool = Field(strict=True, alias="mig-enabled")
    mig_devices: Annotated[
        dict[str, Count], BeforeValidator(_empty_map), AfterValidator(_without_zeros)
    ] = Field(
        default_factory=dict, alias="mig-devices", description="profile -> count, zeros dropped"
    )
    device_filter: Annotated[tuple[PciId, ...], BeforeValidator(_one_or_many)] = Field(
        (), alias="device-filter", description="PCI device/vendor ids; empty matches every GPU"
    )

    @model_validator(mode="after")
    def _counts_need_mig(self) -> Self:
        if not self.mig_enabled and self.mig_devices:
            found = FieldError()
            found.add("mig-devices", "must be empty when mig-enabled is false")
            raise found
        return self


class LayoutSchema(Schema):
    """A layout file as written: named layouts, each a non-empty list of device entries."""

    mig_configs: dict[str, Annotated[tuple[DeviceSpec, ...], Field(min_length=1)]] = Field(
        alias="mig-configs"
    )


@dataclass(frozen=True, slots=True)
class MigConfigFile:
    """A parsed layout file: named layouts, each a list of device specs."""

    path: str
    configs: Mapping[str, tuple[DeviceSpec, ...]]
    source: Document  # where each layout and entry is, for the messages of :func:`resolve`

    def problem(self, where: FieldPath, message: str) -> Problem:
        """A problem at ``where`` (relative to ``mig-configs``), with its line."""
        place = ("mig-configs", *where)
        return Problem(self.path, self.source.line(place), dotted(place), message)


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """What validation needs to know about one GPU of the node."""

    index: int
    model: str
    pci_device_id: int
    geometry: MigGeometry | None  # None: not MIG-capable


@dataclass(frozen=True, slots=True)
class GpuTarget:
    """The layout one GPU should have."""

    index: int
    mig_enabled: bool
    devices: Mapping[str, int]  # profile -> count, zero counts dropped


class Hook(Schema):
    """One command of a hooks file (mig-parted hooks v1)."""

    command: str = Field(min_length=1, description="a path or a program name")
    args: tuple[str, ...] = ()
    envs: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None

    # What the operating system refuses only when the hook runs, refused when the file is read.
    @field_validator("command", "workdir")
    @classmethod
    def _no_nul(cls, value: str | None) -> str | None:
        if value is not None and "\0" in value:
            raise ValueError("must not contain a NUL character")
        return value

    @field_validator("args")
    @classmethod
    def _no_nul_in_args(cls, args: tuple[str, ...]) -> tuple[str, ...]:
        for n, arg in enumerate(args):
            if "\0" in arg:
                raise ValueError(f"argument {n} contains a NUL character")
        return args

    @field_validator("envs")
    @classmethod
    def _env_names(cls, envs: dict[str, str]) -> dict[str, str]:
        for name, value in envs.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"{name!r} is not an environment variable name")
            if "\0" in value:
                raise ValueError(f"the value of {name} contains a NUL character")
        return envs


class HookLists(Schema):
    """The commands of each hook mig-parted knows, in the order they run."""

    apply_start: tuple[Hook, ...] = Field((), alias="apply-start")
    pre_apply_mode: tuple[Hook, ...] = Field((), alias="pre-apply-mode")
    pre_apply_config: tuple[Hook, ...] = Field((), alias="pre-apply-config")
    apply_exit: tuple[Hook, ...] = Field((), alias="apply-exit")


class HooksSchema(Schema):
    """A hooks file as written."""

    hooks: HookLists = Field(default_factory=HookLists)


@dataclass(frozen=True, slots=True)
class HooksFile:
    """Hook commands by hook name."""

    path: str
    hooks: Mapping[str, tuple[Hook, ...]]


def parse_config(text: str | bytes, source: str = "<config>") -> MigConfigFile:
    """Parse a mig-parted v1 layout file.

    Raises:
        ConfigError: every structural problem, each with file, line and field.
    """
    return _layouts(parse_document(text, source))


def load_config(path: Path | str) -> MigConfigFile:
    """Read and parse a layout file.

    Raises:
        ConfigError: the file cannot be read, or any structural problem.
    """
    return _layouts(read_document(Path(path)))


def _layouts(doc: Document) -> MigConfigFile:
    parsed = validate_document(LayoutSchema, doc, kind=LAYOUT_KIND)
    return MigConfigFile(doc.name, parsed.mig_configs, doc)


def parse_hooks(text: str | bytes, source: str = "<hooks>") -> HooksFile:
    """Parse a hooks file in mig-parted's hooks v1 shape.

    Raises:
        ConfigError: every problem, with file, line and field.
    """
    return _hooks(parse_document(text, source))


def load_hooks(path: Path | str) -> HooksFile:
    """Read and parse a hooks file.

    Raises:
        ConfigError: the file cannot be read, or any problem in it.
    """
    return _hooks(read_document(Path(path)))


def _hooks(doc: Document) -> HooksFile:
    parsed = validate_document(HooksSchema, doc, kind=HOOKS_KIND).hooks
    return HooksFile(
        doc.name, {name: getattr(parsed, name.replace("-", "_")) for name in HOOK_NAMES}
    )


def gpu_facts(node: GpuInventory) -> list[GpuFacts]:
    """Facts about every GPU of the node, for :func:`resolve`."""
    out = []
    for i in range(node.count()):
        info = node.info(i)
        out.append(GpuFacts(i, info.name, info.pci_device_id, node.mig_geometry(i)))
    return out


def _indices(indices: Sequence[int]) -> str:
    return ",".join(str(i) for i in indices)


def resolve(cfg: MigConfigFile, name: str, gpus: Sequence[GpuFacts]) -> dict[int, GpuTarget]:
    """The target layout of every GPU the named layout selects (unselected GPUs are absent).

    Raises:
        ConfigError: every problem at once: unknown layout name, indices the node lacks,
            profiles the GPU model does not offer, counts beyond capacity, layouts with no
            valid placement, GPUs selected twice, and a layout none of whose entries
            selects a MIG-capable GPU. An entry that selects no GPU beside entries that do
            is not an error (shared files hold one entry per GPU model).
    """
    if name not in cfg.configs:
        names = ", ".join(sorted(cfg.configs)) or "none"
        raise ConfigError.single(cfg.path, f"no layout named {name!r} (the file has: {names})")
    # Problems found on several GPUs of the same model are reported once, naming the GPUs.
    grouped: dict[tuple[FieldPath, str], list[int]] = {}
    plain: list[Problem] = []

    def add(entry: int, sub: FieldPath, gpu: int, message: str) -> None:
        grouped.setdefault(((name, entry, *sub), message), []).append(gpu)

    by_index = {g.index: g for g in gpus}
    targets: dict[int, GpuTarget] = {}
    owner: dict[int, int] = {}  # GPU -> the entry that selected it
    for entry, spec in enumerate(cfg.configs[name]):
        if spec.devices is None:
            chosen = [g.index for g in gpus]
        else:
            missing = [d for d in spec.devices if d not in by_index]
            if missing:
                plain.append(
                    cfg.problem(
                        (name, entry, "devices"),
                        f"no GPU {_indices(missing)} on this node (it has GPUs 0-{len(gpus) - 1})"
                        if gpus
                        else f"no GPU {_indices(missing)}: this node has no GPU",
                    )
                )
            chosen = [d for d in spec.devices if d in by_index]
        if spec.device_filter:
            chosen = [i for i in chosen if by_index[i].pci_device_id in spec.device_filter]
        for i in chosen:
            gpu = by_index[i]
            if i in owner:
                plain.append(
                    cfg.problem(
                        (name, entry),
                        f"GPU {i} is already selected by mig-configs.{name}[{owner[i]}]; "
                        "narrow `devices` or `device-filter`",
                    )
                )
                continue
            if gpu.geometry is None:
                if spec.mig_enabled and spec.devices is not None:
                    add(entry, ("mig-enabled",), i, f"{gpu.model} does not support MIG")
                continue  # mig-parted skips non-MIG GPUs under `devices: all`
            owner[i] = entry
            if spec.mig_enabled and _check_devices(spec, gpu, gpu.geometry, entry, add):
                targets[i] = GpuTarget(i, True, dict(spec.mig_devices))
            elif not spec.mig_enabled:
                targets[i] = GpuTarget(i, False, {})
    # An entry whose selector matches no GPU here is normal beside entries that do match:
    # mig-parted's shared files give each GPU model its own entry under one layout name, and
    # every node skips the entries for the models it lacks. A layout none of whose entries
    # selects a GPU is an error, reported even beside other problems (an index the node lacks
    # does not explain a filter that matches nothing), so one run names every problem.
    if not owner and not grouped:
        plain.append(
            cfg.problem(
                (name,),
                "selects no MIG-capable GPU on this node (GPUs: "
                + "; ".join(f"{g.index}={g.model} 0x{g.pci_device_id:08X}" for g in gpus)
                + ")",
            )
        )
    problems = plain + [
        cfg.problem(where, f"GPU {_indices(sorted(set(idx)))}: {msg}")
        for (where, msg), idx in grouped.items()
    ]
    if problems:
        problems.sort(key=lambda p: (p.line or 0, p.field))
        raise ConfigError(problems)
    return targets


def _check_devices(
    spec: DeviceSpec, gpu: GpuFacts, geometry: MigGeometry, entry: int, add: Any
) -> bool:
    """Check one entry's profile counts against one GPU's geometry; False when invalid."""
    ok = True
    offered = ", ".join(rank_order(geometry))
    for prof, count in spec.mig_devices.items():
        sub = ("mig-devices", prof)
        found = geometry.profile(prof)
        if found is None:
            if prof.count(".") >= 2 and prof.split(".", 1)[0].endswith("c"):
                why = (
                    "compute-instance profiles are not supported (one compute instance spans "
                    "each GPU instance); use the GPU-instance profile name"
                )
            else:
                why = f"{gpu.model} offers no profile {prof!r} (it offers {offered})"
            add(entry, sub, gpu.index, why)
            ok = False
        elif count > found.max_count:
            add(entry, sub, gpu.index, f"{count} x {prof} asked, at most {found.max_count} fit")
            ok = False
    if ok:
        reason = check_layout(geometry, spec.mig_devices)
        if reason is not None:
            add(entry, ("mig-devices",), gpu.index, f"no valid placement: {reason}")
            ok = False
    return ok


# --- export -----------------------------------------------------------------------------------


def render_config(name: str, targets: Sequence[GpuTarget]) -> str:
    """A v1 layout file with one entry per GPU that reproduces ``targets`` exactly."""
    lines = ["version: v1", "mig-configs:", f"  {name}:"]
    for t in sorted(targets, key=lambda t: t.index):
        lines.append(f"    - devices: [{t.index}]")
        lines.append(f"      mig-enabled: {'true' if t.mig_enabled else 'false'}")
        if t.mig_enabled:
            if t.devices:
                lines.append("      mig-devices:")
                for prof, count in t.devices.items():
                    lines.append(f'        "{prof}": {count}')
            else:
                lines.append("      mig-devices: {}")
    return "\n".join(lines) + "\n"
