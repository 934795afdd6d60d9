"""The node's health as data: the state file outside Kubernetes, and what the CLI prints.

The state file (``<state_dir>/health/status.json``) is rewritten atomically on every change and
at least every ``health.report_interval_s``; ``nodeagent health`` reads it and shows its age, so
a stopped agent is visible as a stale file rather than a healthy node.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nodeagent.atomicfile import first_problem, read_json, write_json_atomic

if TYPE_CHECKING:  # readers of the file (`nodeagent status`) need not load the model
    from nodeagent.health.model import NodeHealth

STATUS_VERSION = 1
HEALTH_DIR = "health"
STATUS_FILE = "status.json"
HISTORY_FILE = "history.json"
MAX_TIME_S = 1e11  # seconds since 1970 past year 5000: a damaged file, not a time


def status_path(state_dir: Path) -> Path:
    """Where a running agent writes the node's health."""
    return state_dir / HEALTH_DIR / STATUS_FILE


def history_path(state_dir: Path) -> Path:
    """Where the health model keeps its fault history and stability state."""
    return state_dir / HEALTH_DIR / HISTORY_FILE


def node_reasons(health: NodeHealth, limit: int = 8) -> list[str]:
    """The node's reasons, one per faulty GPU-level device, prefixed with the GPU index."""
    out: list[str] = []
    for dev in health.devices:
        if dev.uuid in health.mig_parent or not dev.reasons:
            continue
        out.extend(f"gpu{dev.gpu_index}: {r}" for r in dev.reasons)
    for dev in health.devices:
        parent = health.mig_parent.get(dev.uuid)
        if parent is None or not dev.reasons:
            continue
        # A MIG device's own reasons (not inherited from its GPU) are worth listing too.
        gpu_reasons = next((d.reasons for d in health.devices if d.uuid == parent), ())
        out.extend(
            f"gpu{dev.gpu_index} {dev.uuid}: {r}" for r in dev.reasons if r not in gpu_reasons
        )
    if health.flapping:
        out.append(f"flapping: {health.transitions_in_window} state changes in the window")
    return out[:limit]


def to_json(health: NodeHealth, node_name: str) -> dict[str, Any]:
    """The state file's content."""
    return {
        "version": STATUS_VERSION,
        "node": node_name,
        "pid": os.getpid(),
        "timestamp_s": health.timestamp_s,
        "stability": {
            "level": health.level.value,
            "score": round(health.score, 3),
            "flapping": health.flapping,
            "transitions_in_window": health.transitions_in_window,
        },
        "health": health.worst.value,
        "driver_version": health.driver_version,
        "reasons": node_reasons(health),
        "devices": [
            {
                "uuid": d.uuid,
                "gpu": d.gpu_index,
                "parent": health.mig_parent.get(d.uuid),
                "state": d.state.value,
                "reasons": list(d.reasons),
                "action": d.action,
                "since_s": d.since_s,
            }
            for d in health.devices
        ],
        "events_total": dict(health.events_total),
        "xids_total": [
            {"uuid": uuid, "xid": code, "count": n, "last_s": health.xid_last_s.get((uuid, code))}
            for (uuid, code), n in sorted(health.xids_total.items())
        ],
    }


def write_status(state_dir: Path, health: NodeHealth, node_name: str) -> None:
    """Write the state file atomically."""
    write_json_atomic(status_path(state_dir), to_json(health, node_name))


def read_status(state_dir: Path) -> dict[str, Any] | None:
    """The state file's content, or ``None`` when no agent has written one.

    Raises:
        ValueError: the file is corrupt or of an unknown version (named in the message).
    """
    path = status_path(state_dir)
    data = read_json(path)
    if data is None:
        return None
    if not isinstance(data, dict) or data.get("version") != STATUS_VERSION:
        raise ValueError(f"{path}: unknown health status version; upgrade nodeagent")
    from pydantic import ValidationError

    try:
        _status_schema().validate_python(data)
    except ValidationError as exc:
        raise ValueError(f"{path}: {first_problem(exc)}") from None
    return data


@cache
def _status_schema() -> Any:
    """What :func:`to_json` writes, as readers rely on it (a damaged file is named, not a
    traceback); extra keys are allowed, so an older reader takes a newer writer's file."""
    from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

    class Shape(BaseModel):
        model_config = ConfigDict(extra="allow", strict=True)

    class Stability(Shape):
        level: str
        score: float
        flapping: bool
        transitions_in_window: int

    class Device(Shape):
        uuid: str
        gpu: int
        parent: str | None = None
        state: str
        reasons: list[str]
        action: str | None = None
        since_s: float | None = Field(None, ge=0, le=MAX_TIME_S)

    class Xid(Shape):
        uuid: str
        xid: int
        count: int
        last_s: float | None = Field(None, ge=0, le=MAX_TIME_S)

    class Status(Shape):
        node: str
        pid: int
        timestamp_s: float = Field(ge=0, le=MAX_TIME_S)
        stability: Stability
        health: str
        driver_version: str | None = None
        reasons: list[str]
        devices: list[Device]
        events_total: dict[str, int]
        xids_total: list[Xid]

    return TypeAdapter(Status)
