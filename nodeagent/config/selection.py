"""Choosing this node's agent config among named entries by a node label.

NVIDIA's device plugin chart takes a map of named config files (``config.map``), a default
entry (``config.default``) and a node label, ``nvidia.com/device-plugin.config``, whose value
names the entry a node runs with; GPU Operator users label their nodes that way. The Helm
chart keeps that contract for the agent's own config files: it renders each entry into a
ConfigMap, and the pod's init container (:mod:`nodeagent.agent.config_select`) copies the
entry this module chooses to where ``nodeagent run`` reads its config.

The order is NVIDIA's: the label's entry; else the default entry; else the fallback
strategies in their order (``named``: an entry called ``default``; ``single``: the only
entry). A label naming no entry is an error rather than a quiet fallback: the operator asked
for a config this node cannot have.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

CONFIG_LABEL = "nvidia.com/device-plugin.config"
# The entry the `named` fallback picks.
NAMED_DEFAULT = "default"
# ConfigMap keys may carry a YAML suffix; the entry's name is the key without it.
_SUFFIXES = (".yaml", ".yml")


class Fallback(enum.StrEnum):
    """What to choose when neither the label nor the default names an entry."""

    NAMED = "named"  # the entry called "default"
    SINGLE = "single"  # the only entry, when there is exactly one


class SelectionError(ValueError):
    """No entry can be chosen; the message names the label, the default and the entries."""


@dataclass(frozen=True, slots=True)
class Choice:
    """The entry chosen and why (for the one line the init container logs)."""

    name: str
    reason: str


def parse_fallbacks(text: str) -> tuple[Fallback, ...]:
    """``named,single`` as strategies; raises SelectionError naming an unknown one."""
    out: list[Fallback] = []
    for word in (w.strip() for w in text.split(",")):
        if not word:
            continue
        try:
            out.append(Fallback(word))
        except ValueError:
            known = ", ".join(f.value for f in Fallback)
            raise SelectionError(f"unknown fallback strategy {word!r} (known: {known})") from None
    return tuple(out)


def entry_name(key: str) -> str:
    """The entry a ConfigMap key holds: ``mig-mixed.yaml`` and ``mig-mixed`` are one entry."""
    for suffix in _SUFFIXES:
        if key.endswith(suffix):
            return key[: -len(suffix)]
    return key


def entries_in(directory: Path) -> dict[str, Path]:
    """The entries of a mounted ConfigMap directory, by name.

    The kubelet's own bookkeeping there (``..data`` and the timestamped directory it points
    to) starts with a dot and is skipped. Two keys for one entry (``a`` and ``a.yaml``) are an
    error: which one the operator meant is not knowable.
    """
    found: dict[str, Path] = {}
    for path in sorted(directory.iterdir()):
        if path.name.startswith(".") or not path.is_file():
            continue
        name = entry_name(path.name)
        if name in found:
            raise SelectionError(
                f"entry {name!r} is given twice in {directory} ({found[name].name}, {path.name})"
            )
        found[name] = path
    return found


def choose(
    entries: Collection[str],
    label: str | None,
    default: str,
    fallbacks: Sequence[Fallback],
    *,
    label_key: str = CONFIG_LABEL,
) -> Choice:
    """The entry this node runs with (see the module docstring for the order).

    Raises:
        SelectionError: the label or the default names no entry, or nothing is chosen.
    """
    known = ", ".join(sorted(entries)) or "none"
    if label:
        if label not in entries:
            raise SelectionError(
                f"node label {label_key}={label} names no config entry (entries: {known})"
            )
        return Choice(label, f"node label {label_key}={label}")
    if default:
        if default not in entries:
            raise SelectionError(f"config.default {default!r} names no entry (entries: {known})")
        return Choice(default, f"no {label_key} label; config.default")
    for strategy in fallbacks:
        if strategy is Fallback.NAMED and NAMED_DEFAULT in entries:
            return Choice(NAMED_DEFAULT, f"no {label_key} label; fallback {strategy}")
        if strategy is Fallback.SINGLE and len(entries) == 1:
            (only,) = entries
            return Choice(only, f"no {label_key} label; fallback {strategy}")
    tried = ", ".join(f.value for f in fallbacks) or "none"
    raise SelectionError(
        f"no {label_key} label, no config.default, and no fallback applies "
        f"(fallbacks: {tried}; entries: {known}); label the node or set config.default"
    )
