"""The DRA plugin's checkpoint file: its schema, its reader and its writer.

One JSON file in the agent's state directory (``<state_dir>/dra/checkpoint.json``): which
claims the DRA plugin prepared, the devices it answered for each, and the MIG instances it made
for them. The DRA driver keeps the claims in memory and writes the whole file at every change
(:mod:`nodeagent_dra.checkpoint`); ``nodeagent mig apply`` and the MIG reconciler read it to know
which instances prepared claims hold, and mark a claim *failed* when ``--force`` destroyed an
instance it held. The file's format has one owner, this module, because both sides read it.

Two processes write the file (the agent's DRA driver, and a ``mig apply --force`` run by an
operator), so every write is a read-merge-write under an exclusive ``flock`` on a lock file
beside it: a failure mark written by one is never lost by the other's next write.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any

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
    """One device of a prepared claim, as NodePrepareResources returned it.

    ``device`` is the device's name in the ResourceSlice (``gpu-3``, or
    ``gpu-3-mig-3g40gb-9-4``: GPU, profile, GI profile ID, start slice); ``mig`` is set only for
    an instance the plugin made for the claim, so the name is what says which instance any
    device stands for.
    """

    requests: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...] = ()
    mig: MigIntent | None = None
    share_id: str | None = None
    mps: MpsRecord | None = None


@dataclass(frozen=True, slots=True)
class ClaimRecord:
    """A claim the plugin prepares (``prepared`` False while its devices are being made).

    ``failed`` is empty for a healthy claim; otherwise it says why the claim's devices are gone
    (``mig apply --force`` destroyed an instance it held). A failed claim holds nothing.
    """

    uid: Annotated[str, Field(exclude=True)]  # the key of the claim in the file
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]
    prepared: bool = False
    since_s: float = 0.0
    failed: str = ""


# The file's claims, uid -> record (the uid is the key, not repeated inside). pydantic reads and
# writes the records field by field, under the aliases the file has always used ("gpu").
# Built at the first read or write, not at import (defer_build).
_CLAIMS = TypeAdapter(dict[str, ClaimRecord], config=ConfigDict(defer_build=True))


def read_claims(path: Path) -> dict[str, ClaimRecord]:
    """The claims in ``path``.

    Raises:
        FileNotFoundError: there is no checkpoint (no claim was ever prepared here).
        OSError: it cannot be read.
        ValueError: it is damaged; the message names what is wrong.
    """
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


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold the checkpoint's write lock (a blocking ``flock``: writes take milliseconds)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_name(f"{path.name}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the flock


def _dump(claims: Mapping[str, ClaimRecord]) -> dict[str, Any]:
    out: dict[str, Any] = _CLAIMS.dump_python(dict(claims), mode="json", by_alias=True)
    for record in out.values():
        # A healthy claim is written as before the field existed, so an older agent (and an
        # older reader) reads the file unchanged.
        if not record.get("failed"):
            record.pop("failed", None)
    return out


def write_claims(path: Path, claims: Mapping[str, ClaimRecord]) -> dict[str, ClaimRecord]:
    """Write ``claims`` (the writer's whole view), keeping failure marks made by another writer.

    A claim in ``claims`` that the file marks failed stays failed. Returns the claims as
    written, so the caller's view includes those marks.

    Raises:
        StateFileError: the file cannot be written; the previous one is left as it was.
    """
    with _locked(path):
        try:
            on_disk = read_claims(path)
        except (OSError, ValueError):
            on_disk = {}  # nothing to keep from a missing or damaged file
        merged = {
            uid: (
                replace(record, failed=on_disk[uid].failed)
                if not record.failed and uid in on_disk and on_disk[uid].failed
                else record
            )
            for uid, record in claims.items()
        }
        write_json_atomic(path, {"version": VERSION, "claims": _dump(merged)})
    return merged


def mark_failed(path: Path, uid: str, why: str) -> ClaimRecord | None:
    """Mark the claim ``uid`` failed (``why``) in the file; the record, or None when absent.

    Raises:
        OSError: the file cannot be read or written.
        ValueError: the file is damaged.
    """
    with _locked(path):
        claims = read_claims(path)
        record = claims.get(uid)
        if record is None:
            return None
        record = replace(record, failed=why)
        claims[uid] = record
        write_json_atomic(path, {"version": VERSION, "claims": _dump(claims)})
    log.warning("DRA claim %s/%s marked failed: %s", record.namespace, record.name, why)
    return record
