"""The simulated node's state: one JSON file in a state directory, shared between processes.

Writers take a file lock, re-read the file, change it and replace it atomically (temp file +
rename), so a reader never sees a half-written file. Readers keep the parsed state in memory and
re-read only when the file's identity changed (inode, mtime, size: one ``stat`` per call), which
keeps an agent's sampling pass of a few hundred NVML calls in the low milliseconds.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nodeagent.atomicfile import write_json_atomic
from nodeagent.sim import presets

if TYPE_CHECKING:
    from filelock import FileLock

STATE_FILE = "state.json"
LOCK_FILE = "state.json.lock"
SCHEMA_VERSION = 1
MADE_UP_PID_START = 4_194_304  # PID_MAX_LIMIT on 64-bit Linux
STAT_TTL_S = 0.002  # reads within this long of the last stat trust it (see read())
# Writes made through any store of this process, by state file: a store whose cache predates
# the latest local write re-reads at once instead of trusting its stat cache.
_LOCAL_WRITES: dict[str, int] = {}
MAX_EVENTS = 1000  # the event queue keeps the newest events; older ones are dropped

State = dict[str, Any]


_log = logging.getLogger(__name__)
# (state dir, preset held, preset asked for) already warned about in this process: a CLI command
# or an agent may open the node several times, and one warning says it all.
_WARNED: set[tuple[str, str, str]] = set()


def _warn_other_preset(state_dir: Path, held: str, asked: str) -> None:
    """Say once that ``state_dir`` holds a ``held`` node although ``asked`` was named."""
    key = (str(state_dir), held, asked)
    if key in _WARNED:
        return
    _WARNED.add(key)
    _log.warning(
        "simulated node in %s is a %s, not the %s asked for; using it as it is. To switch: "
        "nodeagent sim reset --simulate %s --state-dir %s (or pass another --state-dir)",
        state_dir, held, asked, asked, shlex.quote(str(state_dir)),
    )  # fmt: skip


class SimStateError(Exception):
    """The state directory cannot be used (unreadable, corrupt, or no preset to seed it)."""


class SimStateCorruptError(SimStateError):
    """The state file exists but is not a simulated node (truncated, edited, another format).

    The message names the file, what is wrong and the command that recreates the node.
    """

    def __init__(self, path: Path, what: str, preset: str | None = None) -> None:
        reset = f"nodeagent sim reset --simulate {preset or 'PRESET'} --state-dir "
        reset += shlex.quote(str(path.parent))
        super().__init__(f"simulated node state {path} is corrupt ({what}); recreate it: {reset}")
        self.path = path
        self.what = what
        self.preset = preset


# What every state file has at the top, and what every GPU entry has: enough that a damaged
# file is refused at load in one line instead of failing later inside some NVML call.
_STATE_KEYS: dict[str, type | tuple[type, ...]] = {
    "schema": int,
    "preset": str,
    "generation": int,
    "driver_version": str,
    "cuda_driver_version": int,
    "next_pid": int,
    "next_serial": int,
    "event_seq": int,
    "events": list,
    "processes": list,
    "gpus": list,
}
_GPU_KEYS: dict[str, type | tuple[type, ...]] = {
    "index": int,
    "uuid": str,
    "model": str,
    "serial": str,
    "bus": int,
    "minor": int,
    "numa": (int, type(None)),
    "nvlinks": list,
    "mig": dict,
    "instances": list,
    "faults": dict,
    "ecc": dict,
    "remap": dict,
    "retired": dict,
    "pcie_replay": int,
    "nvlink_errors": int,
    "energy": dict,
}


def check_state(path: Path, state: object) -> State:
    """``state`` as a node, or SimStateCorruptError saying what is wrong with it."""
    if not isinstance(state, dict):
        raise SimStateCorruptError(path, f"it holds {type(state).__name__}, not an object")
    preset = state.get("preset") if isinstance(state.get("preset"), str) else None
    for key, kind in _STATE_KEYS.items():
        if not isinstance(state.get(key), kind):
            raise SimStateCorruptError(path, f"{key!r} is missing or not {_name(kind)}", preset)
    if state["schema"] != SCHEMA_VERSION:
        raise SimStateCorruptError(
            path, f"schema {state['schema']!r}, this version reads {SCHEMA_VERSION}", preset
        )
    if not state["gpus"]:
        raise SimStateCorruptError(path, "no GPUs", preset)
    for i, gpu in enumerate(state["gpus"]):
        if not isinstance(gpu, dict):
            raise SimStateCorruptError(path, f"GPU {i} is not an object", preset)
        for key, kind in _GPU_KEYS.items():
            if key not in gpu or not isinstance(gpu[key], kind):
                raise SimStateCorruptError(
                    path, f"GPU {i}: {key!r} is missing or not {_name(kind)}", preset
                )
        if gpu["index"] != i:
            raise SimStateCorruptError(path, f"GPU {i} says it is GPU {gpu['index']}", preset)
    return state


def _name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {"int": "a number", "str": "text", "list": "a list", "dict": "an object"}
    return " or ".join(names.get(k.__name__, "null") for k in kinds)


def default_state_dir() -> Path:
    """The state directory: ``$NODEAGENT_SIM_STATE``, else under the XDG state home."""
    env = os.environ.get("NODEAGENT_SIM_STATE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "state"
    return base / "nodeagent" / "sim"


def new_state(preset_name: str, now: float) -> State:
    """A fresh node for ``preset_name``: MIG off everywhere, no instances, no faults."""
    preset = presets.get_preset(preset_name)
    gpus = presets.initial_gpus(preset)
    for gpu in gpus:
        gpu["energy"]["t"] = now
    return {
        "schema": SCHEMA_VERSION,
        "preset": preset.name,
        "generation": 0,
        "created_s": now,
        "driver_version": presets.DRIVER_VERSION,
        "cuda_driver_version": presets.CUDA_DRIVER_VERSION,
        # Made-up PIDs start at Linux's PID_MAX_LIMIT (2^22), above any PID the kernel gives:
        # a made-up process never names a live host process, whose cgroup (not a pod's) would
        # otherwise decide its attribution.
        "next_pid": MADE_UP_PID_START,
        "next_serial": 1,  # creation serial for instances (stale handle detection, MIG UUIDs)
        "event_seq": 0,
        "events": [],
        "processes": [],
        "gpus": gpus,
    }


class StateStore:
    """Cached, lock-guarded access to one state directory.

    Args:
        state_dir: the directory holding ``state.json``; created when missing.
        clock: wall clock used to timestamp the state (tests pass a fake one).
    """

    def __init__(self, state_dir: Path, clock: Callable[[], float] = time.time) -> None:
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / STATE_FILE
        self.clock = clock
        self._file_lock: FileLock | None = None
        self._mutex = threading.RLock()
        self._cached: State | None = None
        self._stamp: tuple[int, int, int] | None = None
        # (state, monotonic time of the last stat, _LOCAL_WRITES[path] then) as one value: what
        # read()'s lock-free check reads.
        self._trusted: tuple[State, float, int] | None = None
        self._key = os.path.abspath(self.path)
        self._swept = False

    @property
    def _lock(self) -> FileLock:
        """The writers' lock, made on first use: a command that only reads never imports it."""
        if self._file_lock is None:
            from filelock import FileLock

            path = self.state_dir / LOCK_FILE
            # filelock retries a lock file it cannot create (a directory under /proc, no
            # permission) forever: find out first, and say so.
            try:
                os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o644))
            except OSError as exc:
                raise SimStateError(
                    f"cannot use the simulated node's state dir {self.state_dir}: its lock file "
                    f"cannot be created ({exc.strerror}); pass a writable --state-dir"
                ) from None
            self._file_lock = FileLock(str(path))
        return self._file_lock

    # --- reading ------------------------------------------------------------------------------
    def exists(self) -> bool:
        """Whether the directory already holds a node."""
        return self.path.exists()

    def read(self, *, fresh: bool = False) -> State:
        """The current state; re-parsed only when the file changed since the last read.

        Callers must treat the result as read-only: it is shared with other readers.
        ``fresh`` skips the short stat cache (after a change notification).
        Raises SimStateError when there is no state file or it cannot be parsed.
        """
        now = time.monotonic()
        # One agent pass makes ~1,000 NVML calls within a few milliseconds: one stat per
        # STAT_TTL_S serves them all. Another process's change is seen at most that late;
        # this process's own writes drop the cache at once. The check reads one immutable
        # tuple, so it needs no lock (it was a third of a cheap NVML call's cost).
        local_writes = _LOCAL_WRITES.get(self._key, 0)
        trusted = self._trusted
        if (
            not fresh
            and trusted is not None
            and now - trusted[1] < STAT_TTL_S
            and local_writes == trusted[2]
        ):
            return trusted[0]
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            raise SimStateError(f"no simulated node in {self.state_dir}") from None
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        with self._mutex:
            if self._cached is None or stamp != self._stamp:
                self._cached, self._stamp = self._load(), stamp
            self._trusted = (self._cached, now, local_writes)
            return self._cached

    def _load(self) -> State:
        try:
            with open(self.path, encoding="utf-8") as handle:
                data = json.load(handle)
        except OSError as exc:
            raise SimStateError(f"cannot read {self.path}: {exc.strerror}") from exc
        except ValueError as exc:  # truncated or garbled JSON, or bytes that are not UTF-8
            raise SimStateCorruptError(self.path, f"not JSON: {exc}") from None
        return check_state(self.path, data)

    # --- writing ------------------------------------------------------------------------------
    def ensure(self, preset_name: str | None) -> State:
        """Seed an empty directory from ``preset_name``; an existing node is kept as it is.

        An existing node of another preset wins (docs/simulator.md), with one warning per
        process, state directory and preset pair naming both presets and how to switch.
        """
        if not self._swept:
            self._sweep()
        if self.exists():
            try:
                state = self.read()
            except SimStateCorruptError as exc:
                # Name the preset the caller asked for in the reset command, when the file no
                # longer says which it was.
                raise SimStateCorruptError(exc.path, exc.what, exc.preset or preset_name) from None
            held = state.get("preset")
            if preset_name and held and held != preset_name:
                _warn_other_preset(self.state_dir, str(held), preset_name)
            return state
        if not preset_name:
            raise SimStateError(f"no simulated node in {self.state_dir} and no preset to seed it")
        presets.get_preset(preset_name)  # fail before taking the lock on a bad name
        self._make_dir()
        with self._lock:
            if not self.path.exists():
                self._write(new_state(preset_name, self.clock()))
                self._write_host(presets.get_preset(preset_name))
        return self.read()

    def _make_dir(self) -> None:
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            what = "a file is in its place" if isinstance(exc, FileExistsError) else exc.strerror
            raise SimStateError(
                f"cannot use the simulated node's state dir {self.state_dir}: {what}; pass a "
                "writable --state-dir"
            ) from None

    def _write_host(self, preset: presets.Preset) -> None:
        """The simulated host's files (DMI product name, PCI classes) under ``host/``, for the
        readers that take a host root (the capability labels)."""
        for relative, text in presets.host_files(preset).items():
            path = self.state_dir / presets.HOST_DIR / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)

    def _sweep(self) -> None:
        """Remove temporary state files a killed writer left (``.state.json.*.tmp``).

        Under the state lock, which every writer holds from the temporary file to the rename:
        a temporary file seen here belongs to no write in progress.
        """
        self._swept = True
        if not self.state_dir.is_dir() or not any(self.state_dir.glob(f".{STATE_FILE}.*.tmp")):
            return
        with self._lock:
            for leftover in self.state_dir.glob(f".{STATE_FILE}.*.tmp"):
                leftover.unlink(missing_ok=True)
                _log.info("removed %s, left by a writer that was killed", leftover)

    def replace(self, state: State) -> None:
        """Overwrite the node with ``state`` (used by reset) and its host files (its preset's)."""
        self._make_dir()
        with self._lock:
            self._write(state)
            preset = presets.PRESETS.get(str(state.get("preset")))
            if preset is not None:
                self._write_host(preset)

    def mutate(self, change: Callable[[State], Any]) -> Any:
        """Apply ``change`` to a fresh copy of the state under the lock and write it back.

        ``change`` may raise to abort; nothing is written then. Returns what ``change`` returns.
        """
        with self._lock:
            state = self._load()  # always re-read under the lock, never trust the cache
            result = change(state)
            state["generation"] = int(state.get("generation", 0)) + 1
            self._write(state)
            return result

    def _write(self, state: State) -> None:
        # Not fsynced: the simulated node is rewritten on every change, and losing the last
        # change to a power cut is harmless; the rename still keeps readers consistent.
        write_json_atomic(self.path, state, durable=False, compact=True)
        with self._mutex:
            # The next read() re-stats and reloads; drop the cache so it cannot be reused.
            self._cached, self._stamp, self._trusted = None, None, None
            _LOCAL_WRITES[self._key] = _LOCAL_WRITES.get(self._key, 0) + 1


def append_event(state: State, event: dict[str, Any]) -> None:
    """Queue an event with the next sequence number, keeping the newest MAX_EVENTS."""
    state["event_seq"] = int(state["event_seq"]) + 1
    event["seq"] = state["event_seq"]
    events: list[dict[str, Any]] = state["events"]
    events.append(event)
    if len(events) > MAX_EVENTS:
        del events[: len(events) - MAX_EVENTS]
