"""mig-parted v1 layout files and hooks files: strict parsing and validation against a node.

The layout format is mig-parted's ``version: v1`` file, accepted unchanged::

    version: v1
    mig-configs:
      all-balanced:
        - device-filter: ["0x233010DE"]   # optional: PCI device id(s)
          devices: all                    # or a list of GPU indices
          mig-enabled: true
          mig-devices: {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}

Validation collects every problem before failing, each with the file, the line and the field:
structure (unknown fields, wrong types, unknown version) in :func:`parse_config`, and what
depends on the node (profiles the GPU model offers, counts, placements, selectors) in
:func:`resolve`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from nodeagent.capacity import rank_order
from nodeagent.gpu.protocols import GpuInventory
from nodeagent.gpu.types import MigGeometry
from nodeagent_mig.planner import check_layout

VERSION = "v1"
DEFAULT_CONFIG_FILE = Path(__file__).with_name("default-config.yaml")
HOOK_NAMES = ("apply-start", "pre-apply-mode", "pre-apply-config", "apply-exit")


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a file: where it is and what is wrong."""

    file: str
    line: int | None
    field: str  # dotted path, e.g. mig-configs.all-balanced[0].mig-devices.1g.10gb
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        return (
            f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"
        )


class MigConfigError(ValueError):
    """A layout or hooks file is invalid; ``problems`` lists every problem found."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """One entry of a named layout: which GPUs, MIG on or off, and the profile counts."""

    devices: tuple[int, ...] | None  # None means ``all``
    mig_enabled: bool
    mig_devices: Mapping[str, int]
    device_filter: tuple[int, ...]  # combined PCI device/vendor ids; empty matches every GPU
    where: str  # where the entry is, for messages: mig-configs.NAME[i]
    line: int | None
    lines: Mapping[str, int] = field(default_factory=dict)  # sub-field -> line

    def line_of(self, sub: str) -> int | None:
        """The line of a sub-field (``devices``, ``mig-devices.1g.10gb``), else the entry's."""
        return self.lines.get(sub, self.line)


@dataclass(frozen=True, slots=True)
class MigConfigFile:
    """A parsed layout file: named layouts, each a list of device specs."""

    path: str
    configs: Mapping[str, tuple[DeviceSpec, ...]]
    name_lines: Mapping[str, int] = field(default_factory=dict)


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


@dataclass(frozen=True, slots=True)
class Hook:
    """One command of a hooks file (mig-parted hooks v1)."""

    command: str
    args: tuple[str, ...] = ()
    envs: Mapping[str, str] = field(default_factory=dict)
    workdir: str | None = None


@dataclass(frozen=True, slots=True)
class HooksFile:
    """Hook commands by hook name."""

    path: str
    hooks: Mapping[str, tuple[Hook, ...]]


# --- YAML node helpers --------------------------------------------------------------------------


class _Reader:
    """Walks composed YAML nodes, turning them into values and recording problems with lines."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.problems: list[Problem] = []

    def problem(self, node: yaml.Node | None, where: str, message: str) -> None:
        line = node.start_mark.line + 1 if node is not None else None
        self.problems.append(Problem(self.source, line, where, message))

    def compose(self, text: str) -> yaml.Node | None:
        try:
            return yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = mark.line + 1 if mark is not None else None
            reason = getattr(exc, "problem", None) or str(exc)
            self.problems.append(Problem(self.source, line, "", f"not valid YAML: {reason}"))
            return None

    @staticmethod
    def scalar(node: yaml.Node) -> Any:
        return yaml.SafeLoader("").construct_object(node, deep=True)

    def mapping(
        self, node: yaml.Node, where: str, allowed: Sequence[str] | None = None
    ) -> Iterator[tuple[str, yaml.Node, yaml.Node]]:
        """Yield (key, key node, value node); unknown keys (when ``allowed``) are problems."""
        if not isinstance(node, yaml.MappingNode):
            self.problem(node, where, "expected a mapping")
            return
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = str(key_node.value)
            sub = f"{where}.{key}" if where else key
            if key in seen:
                self.problem(key_node, sub, "given twice")
                continue
            seen.add(key)
            if allowed is not None and key not in allowed:
                self.problem(key_node, sub, f"unknown field (allowed: {', '.join(allowed)})")
                continue
            yield key, key_node, value_node

    def check_version(self, root: yaml.Node) -> None:
        version = None
        if isinstance(root, yaml.MappingNode):
            for key_node, value_node in root.value:
                if key_node.value == "version":
                    version = value_node
        if version is None:
            self.problem(root, "version", f"missing; add `version: {VERSION}`")
        elif self.scalar(version) != VERSION:
            self.problem(
                version,
                "version",
                f"unsupported version {version.value!r}; only {VERSION} is known",
            )


def _parse_pci_id(raw: Any) -> int | None:
    if not isinstance(raw, str) or not raw.lower().startswith("0x"):
        return None
    try:
        value = int(raw, 16)
    except ValueError:
        return None
    return value if 0 < value <= 0xFFFFFFFF else None


def parse_config(text: str, source: str = "<config>") -> MigConfigFile:
    """Parse a mig-parted v1 layout file.

    Raises:
        MigConfigError: every structural problem, each with file, line and field.
    """
    r = _Reader(source)
    root = r.compose(text)
    configs: dict[str, tuple[DeviceSpec, ...]] = {}
    name_lines: dict[str, int] = {}
    if root is None:
        if not r.problems:
            r.problem(None, "", "the file is empty; it needs `version: v1` and `mig-configs`")
        raise MigConfigError(r.problems)
    r.check_version(root)
    found_configs = False
    for key, _key_node, value in r.mapping(root, "", ("version", "mig-configs")):
        if key != "mig-configs":
            continue
        found_configs = True
        for name, name_node, specs_node in r.mapping(value, "mig-configs"):
            name_lines[name] = name_node.start_mark.line + 1
            where = f"mig-configs.{name}"
            if not isinstance(specs_node, yaml.SequenceNode) or not specs_node.value:
                r.problem(specs_node, where, "expected a non-empty list of device entries")
                continue
            configs[name] = tuple(
                _parse_spec(r, item, f"{where}[{i}]") for i, item in enumerate(specs_node.value)
            )
    if not found_configs and isinstance(root, yaml.MappingNode):
        r.problem(root, "mig-configs", "missing; add a `mig-configs:` mapping of named layouts")
    if r.problems:
        raise MigConfigError(r.problems)
    return MigConfigFile(source, configs, name_lines)


_SPEC_FIELDS = ("devices", "mig-enabled", "mig-devices", "device-filter")


def _parse_spec(r: _Reader, node: yaml.Node, where: str) -> DeviceSpec:
    devices: tuple[int, ...] | None = None
    enabled: bool | None = None
    mig_devices: dict[str, int] = {}
    filters: list[int] = []
    lines: dict[str, int] = {}
    have_devices = False
    md_node: yaml.Node | None = None
    for key, key_node, value in r.mapping(node, where, _SPEC_FIELDS):
        sub = f"{where}.{key}"
        lines[key] = key_node.start_mark.line + 1
        if key == "devices":
            have_devices = True
            raw = r.scalar(value)
            if raw == "all":
                devices = None
            elif isinstance(raw, list) and all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in raw
            ):
                devices = tuple(raw)
                if not devices:
                    r.problem(value, sub, "empty list; name GPU indices or use `all`")
            else:
                r.problem(value, sub, "expected `all` or a list of GPU indices like [0, 1]")
        elif key == "mig-enabled":
            raw = r.scalar(value)
            if isinstance(raw, bool):
                enabled = raw
            else:
                r.problem(value, sub, "expected true or false")
        elif key == "mig-devices":
            md_node = value
            if isinstance(value, yaml.ScalarNode) and r.scalar(value) is None:
                continue  # `mig-devices:` with nothing is an empty map
            for prof, prof_node, count_node in r.mapping(value, sub):
                lines[f"mig-devices.{prof}"] = prof_node.start_mark.line + 1
                count = r.scalar(count_node)
                if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                    r.problem(count_node, f"{sub}.{prof}", "expected a count >= 0")
                    continue
                mig_devices[prof] = count
        elif key == "device-filter":
            raw = r.scalar(value)
            items = raw if isinstance(raw, list) else [raw]
            for item in items:
                pci = _parse_pci_id(item)
                if pci is None:
                    r.problem(value, sub, f'{item!r} is not a PCI device id like "0x233010DE"')
                else:
                    filters.append(pci)
    if not have_devices:
        r.problem(node, f"{where}.devices", "missing; use `all` or a list of GPU indices")
    if enabled is None and "mig-enabled" not in lines:
        r.problem(node, f"{where}.mig-enabled", "missing; use true or false")
    if enabled is False and any(mig_devices.values()):
        r.problem(md_node, f"{where}.mig-devices", "must be empty when mig-enabled is false")
    if mig_devices and not any(mig_devices.values()):
        r.problem(md_node, f"{where}.mig-devices", "every count is 0; remove it or give a count")
    return DeviceSpec(
        devices=devices,
        mig_enabled=bool(enabled),
        mig_devices={k: v for k, v in mig_devices.items() if v},
        device_filter=tuple(filters),
        where=where,
        line=node.start_mark.line + 1,
        lines=lines,
    )


def load_config(path: Path | str) -> MigConfigFile:
    """Read and parse a layout file.

    Raises:
        MigConfigError: the file cannot be read, or any structural problem.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise MigConfigError(
            [Problem(str(path), None, "", f"cannot read: {exc.strerror}")]
        ) from exc
    return parse_config(text, str(path))


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
        MigConfigError: every problem at once: unknown layout name, indices the node lacks,
            profiles the GPU model does not offer, counts beyond capacity, layouts with no
            valid placement, GPUs selected twice, and a layout none of whose entries
            selects a MIG-capable GPU. An entry that selects no GPU beside entries that do
            is not an error (shared files hold one entry per GPU model).
    """
    if name not in cfg.configs:
        names = ", ".join(sorted(cfg.configs)) or "none"
        raise MigConfigError(
            [Problem(cfg.path, None, "", f"no layout named {name!r} (the file has: {names})")]
        )
    # Problems found on several GPUs of the same model are reported once, naming the GPUs.
    grouped: dict[tuple[int | None, str, str], list[int]] = {}
    plain: list[Problem] = []

    def add(spec: DeviceSpec, sub: str, gpu: int, message: str) -> None:
        field_name = f"{spec.where}.{sub}" if sub else spec.where
        grouped.setdefault((spec.line_of(sub), field_name, message), []).append(gpu)

    by_index = {g.index: g for g in gpus}
    targets: dict[int, GpuTarget] = {}
    owner: dict[int, DeviceSpec] = {}
    for spec in cfg.configs[name]:
        if spec.devices is None:
            chosen = [g.index for g in gpus]
        else:
            missing = [d for d in spec.devices if d not in by_index]
            if missing:
                plain.append(
                    Problem(
                        cfg.path,
                        spec.line_of("devices"),
                        f"{spec.where}.devices",
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
                    Problem(
                        cfg.path,
                        spec.line,
                        spec.where,
                        f"GPU {i} is already selected by {owner[i].where}; "
                        "narrow `devices` or `device-filter`",
                    )
                )
                continue
            if gpu.geometry is None:
                if spec.mig_enabled and spec.devices is not None:
                    add(spec, "mig-enabled", i, f"{gpu.model} does not support MIG")
                continue  # mig-parted skips non-MIG GPUs under `devices: all`
            owner[i] = spec
            if spec.mig_enabled and _check_devices(spec, gpu, gpu.geometry, add):
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
            Problem(
                cfg.path,
                cfg.name_lines.get(name),
                f"mig-configs.{name}",
                "selects no MIG-capable GPU on this node (GPUs: "
                + "; ".join(f"{g.index}={g.model} 0x{g.pci_device_id:08X}" for g in gpus)
                + ")",
            )
        )
    problems = plain + [
        Problem(cfg.path, line, fld, f"GPU {_indices(sorted(set(idx)))}: {msg}")
        for (line, fld, msg), idx in grouped.items()
    ]
    if problems:
        problems.sort(key=lambda p: (p.line or 0, p.field))
        raise MigConfigError(problems)
    return targets


def _check_devices(spec: DeviceSpec, gpu: GpuFacts, geometry: MigGeometry, add: Any) -> bool:
    """Check one entry's profile counts against one GPU's geometry; False when invalid."""
    ok = True
    offered = ", ".join(rank_order(geometry))
    for prof, count in spec.mig_devices.items():
        sub = f"mig-devices.{prof}"
        found = geometry.profile(prof)
        if found is None:
            if prof.count(".") >= 2 and prof.split(".", 1)[0].endswith("c"):
                why = (
                    "compute-instance profiles are not supported (one compute instance spans "
                    "each GPU instance); use the GPU-instance profile name"
                )
            else:
                why = f"{gpu.model} offers no profile {prof!r} (it offers {offered})"
            add(spec, sub, gpu.index, why)
            ok = False
        elif count > found.max_count:
            add(spec, sub, gpu.index, f"{count} x {prof} asked, at most {found.max_count} fit")
            ok = False
    if ok:
        reason = check_layout(geometry, spec.mig_devices)
        if reason is not None:
            add(spec, "mig-devices", gpu.index, f"no valid placement: {reason}")
            ok = False
    return ok


# --- hooks ----------------------------------------------------------------------------------------


def parse_hooks(text: str, source: str = "<hooks>") -> HooksFile:
    """Parse a hooks file in mig-parted's hooks v1 shape.

    Raises:
        MigConfigError: every problem, with file, line and field.
    """
    r = _Reader(source)
    root = r.compose(text)
    hooks: dict[str, tuple[Hook, ...]] = {}
    if root is None:
        if not r.problems:
            r.problem(None, "", "the file is empty; it needs `version: v1` and `hooks`")
        raise MigConfigError(r.problems)
    r.check_version(root)
    for key, _k, value in r.mapping(root, "", ("version", "hooks")):
        if key != "hooks":
            continue
        for hook_name, _hn, entries in r.mapping(value, "hooks", HOOK_NAMES):
            where = f"hooks.{hook_name}"
            if not isinstance(entries, yaml.SequenceNode):
                r.problem(entries, where, "expected a list of commands")
                continue
            parsed = []
            for i, entry in enumerate(entries.value):
                hook = _parse_hook(r, entry, f"{where}[{i}]")
                if hook is not None:
                    parsed.append(hook)
            hooks[hook_name] = tuple(parsed)
    if r.problems:
        raise MigConfigError(r.problems)
    return HooksFile(source, hooks)


def _parse_hook(r: _Reader, node: yaml.Node, where: str) -> Hook | None:
    command: str | None = None
    args: tuple[str, ...] = ()
    envs: dict[str, str] = {}
    workdir: str | None = None
    for key, _k, value in r.mapping(node, where, ("command", "args", "envs", "workdir")):
        raw = r.scalar(value)
        sub = f"{where}.{key}"
        if key == "command":
            if isinstance(raw, str) and raw:
                command = raw
            else:
                r.problem(value, sub, "expected a command (a path or a program name)")
        elif key == "args":
            if isinstance(raw, list) and all(isinstance(a, (str, int, float)) for a in raw):
                args = tuple(str(a) for a in raw)
            else:
                r.problem(value, sub, "expected a list of strings")
        elif key == "envs":
            if isinstance(raw, dict):
                envs = {str(k): str(v) for k, v in raw.items()}
            else:
                r.problem(value, sub, "expected a mapping of NAME: value")
        elif key == "workdir":
            if isinstance(raw, str):
                workdir = raw
            else:
                r.problem(value, sub, "expected a directory path")
    if command is None:
        if isinstance(node, yaml.MappingNode) and not any(
            k.value == "command" for k, _ in node.value
        ):
            r.problem(node, f"{where}.command", "missing")
        return None
    return Hook(command, args, envs, workdir)


def load_hooks(path: Path | str) -> HooksFile:
    """Read and parse a hooks file.

    Raises:
        MigConfigError: the file cannot be read, or any problem in it.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise MigConfigError(
            [Problem(str(path), None, "", f"cannot read: {exc.strerror}")]
        ) from exc
    return parse_hooks(text, str(path))


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
