"""The DRA plugin's checkpoint: which claims are prepared, and the MIG instances made for them.

One JSON file in the agent's state directory (``<state_dir>/dra/checkpoint.json``), rewritten
atomically (:mod:`nodeagent.atomicfile`) at every change, so a kill -9 leaves the old file or
the new one. A dynamic MIG instance is written down as an *intent* (GPU, profile, placement)
before it is created and confirmed after: a plugin killed between the two finds the intent on
restart and adopts the instance it finds at that placement instead of creating a second one.

The file's format lives in :mod:`nodeagent.holds.dra_checkpoint`, below the features, because
``nodeagent mig apply`` reads it too (an instance a prepared claim holds is never destroyed
without ``--force``, which marks the claim failed in this file). This module is the driver's
in-memory view of it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from nodeagent.holds.dra_checkpoint import (
    FILE,
    VERSION,
    ClaimRecord,
    MigIntent,
    MpsRecord,
    PreparedDevice,
    checkpoint_path,
    read_claims,
    write_claims,
)

__all__ = [
    "FILE",
    "VERSION",
    "Checkpoint",
    "ClaimRecord",
    "MigIntent",
    "MpsRecord",
    "PreparedDevice",
    "checkpoint_path",
    "read_managed",
]

log = logging.getLogger(__name__)


@dataclass
class Checkpoint:
    """The claims in the file, kept in memory and written through on every change."""

    path: Path
    claims: dict[str, ClaimRecord] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> Checkpoint:
        """Read ``path``; a missing file is empty, an unreadable one is set aside and logged."""
        try:
            claims = read_claims(path)
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

    def failure(self, uid: str) -> str:
        """Why the claim ``uid`` failed ("" when it did not), read from the file: ``mig apply
        --force`` marks it there when it destroys an instance the claim held."""
        try:
            on_disk = read_claims(self.path).get(uid)
        except (OSError, ValueError):
            on_disk = None  # unreadable now: what memory says stands
        record = self.claims.get(uid)
        if record is not None and on_disk is not None and on_disk.failed and not record.failed:
            self.claims[uid] = record = replace(record, failed=on_disk.failed)
        return record.failed if record is not None else ""

    def _write(self) -> None:
        # A claim `mig apply --force` marked failed in the file meanwhile stays failed, and the
        # driver's view learns it here.
        self.claims = write_claims(self.path, self.claims)


def read_managed(state_dir: Path) -> frozenset[tuple[int, str, int]]:
    """(GPU index, profile, start) of the MIG instances the plugin made (for ``dra slices``)."""
    try:
        claims = read_claims(checkpoint_path(state_dir))
    except (OSError, ValueError):
        return frozenset()
    return frozenset(
        (d.mig.gpu_index, d.mig.profile, d.mig.start)
        for c in claims.values()
        if not c.failed  # a forced MIG change took its instance: the plugin holds nothing
        for d in c.devices
        if d.mig is not None
    )
