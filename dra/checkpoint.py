"""The DRA plugin's checkpoint: which claims are prepared, and the MIG instances made for them.

One JSON file in the agent's state directory (``<state_dir>/dra/checkpoint.json``), rewritten
atomically (:mod:`nodeagent.atomicfile`) at every change, so a kill -9 leaves the old file or
the new one. A dynamic MIG instance is written down as an *intent* (GPU, profile, placement)
before it is created and confirmed after: a plugin killed between the two finds the intent on
restart and adopts the instance it finds at that placement instead of creating a second one.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TypeVar

from nodeagent.atomicfile import write_json_atomic

log = logging.getLogger(__name__)

FILE = "checkpoint.json"
VERSION = 1
_T = TypeVar("_T")


def checkpoint_path(state_dir: Path) -> Path:
    """Where the checkpoint of the agent with ``state_dir`` lives."""
    return state_dir / "dra" / FILE


def _plain_json(record: MigIntent | MpsRecord) -> dict[str, Any]:
    """A record of plain values as JSON: each field under its name, ``gpu_index`` as "gpu"."""
    return {
        ("gpu" if f.name == "gpu_index" else f.name): getattr(record, f.name)
        for f in fields(record)
    }


def _optional(convert: Callable[[Any], _T], value: Any) -> _T | None:
    """``value`` read back with ``convert``; None stays None."""
    return None if value is None else convert(value)


@dataclass(frozen=True, slots=True)
class MigIntent:
    """A MIG instance the plugin makes (or made) for a claim's device."""

    gpu_index: int
    profile: str
    start: int
    size: int
    instance_id: int | None = None  # set once created
    uuid: str | None = None

    def to_json(self) -> dict[str, Any]:
        return _plain_json(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> MigIntent:
        return cls(
            int(d["gpu"]),
            str(d["profile"]),
            int(d["start"]),
            int(d["size"]),
            _optional(int, d.get("instance_id")),
            _optional(str, d.get("uuid")),
        )


@dataclass(frozen=True, slots=True)
class MpsRecord:
    """The MPS control daemon a device of an MPS claim needs (rebuilt from here at restart)."""

    uuid: str  # the GPU or MIG device the daemon serves
    gpu_index: int
    active_thread_percentage: int | None = None
    pinned_memory_limit_mib: int | None = None

    def to_json(self) -> dict[str, Any]:
        return _plain_json(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> MpsRecord:
        return cls(
            str(d["uuid"]),
            int(d["gpu"]),
            _optional(int, d.get("active_thread_percentage")),
            _optional(int, d.get("pinned_memory_limit_mib")),
        )


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One device of a prepared claim, as NodePrepareResources returned it."""

    requests: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...] = ()
    mig: MigIntent | None = None
    share_id: str | None = None
    mps: MpsRecord | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": list(self.requests),
            "pool": self.pool,
            "device": self.device,
            "cdi_ids": list(self.cdi_ids),
            "mig": self.mig.to_json() if self.mig else None,
            "share_id": self.share_id,
            "mps": self.mps.to_json() if self.mps else None,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PreparedDevice:
        return cls(
            tuple(str(r) for r in d.get("requests", [])),
            str(d["pool"]),
            str(d["device"]),
            tuple(str(c) for c in d.get("cdi_ids", [])),
            MigIntent.from_json(d["mig"]) if d.get("mig") else None,
            _optional(str, d.get("share_id")),
            MpsRecord.from_json(d["mps"]) if d.get("mps") else None,
        )


@dataclass(frozen=True, slots=True)
class ClaimRecord:
    """A claim the plugin prepares (``prepared`` False while its devices are being made)."""

    uid: str
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]
    prepared: bool = False
    since_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "devices": [d.to_json() for d in self.devices],
            "prepared": self.prepared,
            "since_s": self.since_s,
        }

    @classmethod
    def from_json(cls, uid: str, d: dict[str, Any]) -> ClaimRecord:
        return cls(
            uid,
            str(d["namespace"]),
            str(d["name"]),
            tuple(PreparedDevice.from_json(x) for x in d.get("devices", [])),
            bool(d.get("prepared", False)),
            float(d.get("since_s", 0.0)),
        )


@dataclass
class Checkpoint:
    """The claims in the file, kept in memory and written through on every change."""

    path: Path
    claims: dict[str, ClaimRecord] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> Checkpoint:
        """Read ``path``; a missing file is empty, an unreadable one is set aside and logged."""
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            if raw.get("version") != VERSION:
                raise ValueError(f"version {raw.get('version')!r}, expected {VERSION}")
            claims = {uid: ClaimRecord.from_json(uid, d) for uid, d in raw["claims"].items()}
        except FileNotFoundError:
            return cls(path)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            aside = path.with_name(f"{path.name}.bad-{int(time.time())}")
            path.replace(aside)
            log.error("DRA checkpoint %s is unusable (%s); set aside as %s", path, exc, aside)
            return cls(path)
        return cls(path, claims)

    def put(self, record: ClaimRecord) -> None:
        """Record (or replace) a claim and write the file."""
        self.claims[record.uid] = record
        self._write()

    def drop(self, uid: str) -> None:
        """Forget a claim and write the file."""
        if self.claims.pop(uid, None) is not None:
            self._write()

    def update_device(self, uid: str, index: int, device: PreparedDevice) -> None:
        """Replace one device of a claim and write the file."""
        record = self.claims[uid]
        devices = list(record.devices)
        devices[index] = device
        self.put(replace(record, devices=tuple(devices)))

    def intents(self) -> list[MigIntent]:
        """Every MIG instance the plugin made or is making."""
        return [d.mig for r in self.claims.values() for d in r.devices if d.mig is not None]

    def mps_daemons(self) -> list[tuple[ClaimRecord, PreparedDevice, MpsRecord]]:
        """The MPS daemons prepared claims need, oldest claim first."""
        records = sorted(self.claims.values(), key=lambda r: r.since_s)
        return [
            (r, d, d.mps) for r in records if r.prepared for d in r.devices if d.mps is not None
        ]

    def _write(self) -> None:
        write_json_atomic(
            self.path,
            {"version": VERSION, "claims": {u: r.to_json() for u, r in self.claims.items()}},
        )


def read_managed(state_dir: Path) -> frozenset[tuple[int, str, int]]:
    """(GPU index, profile, start) of the MIG instances the plugin made (for ``dra slices``)."""
    try:
        raw = json.loads(checkpoint_path(state_dir).read_text(encoding="utf-8"))
        return frozenset(
            (int(d["mig"]["gpu"]), str(d["mig"]["profile"]), int(d["mig"]["start"]))
            for c in raw["claims"].values()
            for d in c.get("devices", [])
            if d.get("mig")
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return frozenset()
