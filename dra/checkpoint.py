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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError

from nodeagent.atomicfile import first_problem, write_json_atomic

log = logging.getLogger(__name__)

FILE = "checkpoint.json"
VERSION = 1


def checkpoint_path(state_dir: Path) -> Path:
    """Where the checkpoint of the agent with ``state_dir`` lives."""
    return state_dir / "dra" / FILE


@dataclass(frozen=True, slots=True)
class MigIntent:
    """A MIG instance the plugin makes (or made) for a claim's device."""

    gpu_index: Annotated[int, Field(alias="gpu")]
    profile: str
    start: int
    size: int
    instance_id: int | None = None  # set once created
    uuid: str | None = None


@dataclass(frozen=True, slots=True)
class MpsRecord:
    """The MPS control daemon a device of an MPS claim needs (rebuilt from here at restart)."""

    uuid: str  # the GPU or MIG device the daemon serves
    gpu_index: Annotated[int, Field(alias="gpu")]
    active_thread_percentage: int | None = None
    pinned_memory_limit_mib: int | None = None


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


@dataclass(frozen=True, slots=True)
class ClaimRecord:
    """A claim the plugin prepares (``prepared`` False while its devices are being made)."""

    uid: Annotated[str, Field(exclude=True)]  # the key of the claim in the file
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]
    prepared: bool = False
    since_s: float = 0.0


# The file's claims, uid -> record (the uid is the key, not repeated inside). pydantic reads and
# writes the records field by field, under the aliases the file has always used ("gpu").
# Built at the first read or write, not at import (defer_build).
_CLAIMS = TypeAdapter(dict[str, ClaimRecord], config=ConfigDict(defer_build=True))


def _read(path: Path) -> dict[str, ClaimRecord]:
    """The claims in ``path``; OSError, or ValueError naming what is wrong with the file."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    version = raw.get("version") if isinstance(raw, dict) else None
    if version != VERSION:
        raise ValueError(f"version {version!r}, expected {VERSION}")
    if not isinstance(raw.get("claims"), dict):
        raise ValueError("no claims map")
    try:
        return _CLAIMS.validate_python(
            {
                uid: {**record, "uid": uid} if isinstance(record, dict) else record
                for uid, record in raw["claims"].items()
            }
        )
    except ValidationError as exc:
        raise ValueError(first_problem(exc, "claims")) from None


@dataclass
class Checkpoint:
    """The claims in the file, kept in memory and written through on every change."""

    path: Path
    claims: dict[str, ClaimRecord] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> Checkpoint:
        """Read ``path``; a missing file is empty, an unreadable one is set aside and logged."""
        try:
            claims = _read(path)
        except FileNotFoundError:
            return cls(path)
        except (OSError, ValueError) as exc:
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
            {
                "version": VERSION,
                "claims": _CLAIMS.dump_python(self.claims, mode="json", by_alias=True),
            },
        )


def read_managed(state_dir: Path) -> frozenset[tuple[int, str, int]]:
    """(GPU index, profile, start) of the MIG instances the plugin made (for ``dra slices``)."""
    try:
        claims = _read(checkpoint_path(state_dir))
    except (OSError, ValueError):
        return frozenset()
    return frozenset(
        (d.mig.gpu_index, d.mig.profile, d.mig.start)
        for c in claims.values()
        for d in c.devices
        if d.mig is not None
    )
