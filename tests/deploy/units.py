"""Reading systemd unit files the way systemd does, for the few things the tests need."""

from __future__ import annotations

import shlex
from pathlib import Path


def parse_unit(*paths: Path) -> dict[str, dict[str, list[str]]]:
    """Sections -> key -> values, merging a unit and its drop-ins in order.

    An empty assignment (``Key=``) resets the list, as systemd does for list settings.
    """
    sections: dict[str, dict[str, list[str]]] = {}
    for path in paths:
        section = ""
        for raw in path.read_text().splitlines():
            line = raw.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1]
                sections.setdefault(section, {})
                continue
            key, _, value = line.partition("=")
            values = sections[section].setdefault(key.strip(), [])
            if value.strip():
                values.append(value.strip())
            else:
                values.clear()
    return sections


def unit_with_dropins(unit: Path) -> dict[str, dict[str, list[str]]]:
    """A unit merged with every ``<unit>.d/*.conf`` beside it, in lexical order."""
    dropins = sorted((unit.parent / f"{unit.name}.d").glob("*.conf"))
    return parse_unit(unit, *dropins)


def environment(service: dict[str, list[str]]) -> dict[str, str]:
    """The variables ``Environment=`` and ``EnvironmentFile=`` lines set."""
    env: dict[str, str] = {}
    for path in service.get("EnvironmentFile", []):
        optional = path.startswith("-")
        file = Path(path.lstrip("-"))
        if not file.exists() and optional:
            continue
        for raw in file.read_text().splitlines():
            line = raw.strip()
            if line and not line.startswith("#"):
                key, _, value = line.partition("=")
                env[key.strip()] = value.split("#", 1)[0].strip().strip("\"'")
    for assignments in service.get("Environment", []):
        for item in shlex.split(assignments):
            key, _, value = item.partition("=")
            env[key] = value
    return env


def exec_start(service: dict[str, list[str]]) -> list[str]:
    """The one ExecStart command line, split into arguments."""
    (line,) = service["ExecStart"]
    return shlex.split(line.lstrip("-@+!:"))


def seconds(value: str) -> float:
    """A systemd time span with one unit (``30s``, ``10min``, ``480``) in seconds."""
    units = {"ms": 0.001, "s": 1.0, "min": 60.0, "h": 3600.0}
    for suffix in sorted(units, key=len, reverse=True):
        if value.endswith(suffix) and value[: -len(suffix)].replace(".", "", 1).isdigit():
            return float(value[: -len(suffix)]) * units[suffix]
    return float(value)
