"""Control API of the simulated node: presets, processes, resets and fault injection.

This is what ``nodeagent sim`` and the tests use to change the node from the outside (the
things an operator or the hardware does, not NVML calls). Every change goes through the
shared state directory, so a running agent in another process sees it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Unpack

import pynvml

from nodeagent.sim import ops, presets
from nodeagent.sim.nvml import HANDLE_FUNCTIONS, SimNvml
from nodeagent.sim.state import SimStateCorruptError, SimStateError, State, StateStore, new_state

# nvmlSystemGetProcessName fills a buffer of this many bytes (pynvml passes 1024).
PROCESS_NAME_MAX = 1023


class SimError(ValueError):
    """A control request cannot be carried out. ``str()`` is one line; ``hint`` says what to do."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint


_NVML_REASONS = {
    pynvml.NVML_ERROR_IN_USE: "processes are running on it",
    pynvml.NVML_ERROR_GPU_IS_LOST: "the GPU is lost (fell off the bus)",
    pynvml.NVML_ERROR_NOT_SUPPORTED: "the GPU does not support it",
    pynvml.NVML_ERROR_MEMORY: "that is more than its free memory",
}


class SimControl:
    """Operations on the simulated node in ``state_dir``.

    Args:
        state_dir: the node's state directory.
        preset: seeds an empty state directory on first use.
        clock: wall clock (tests pass a fake one).
    """

    def __init__(
        self,
        state_dir: Path | str,
        preset: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = StateStore(Path(state_dir), clock=clock)
        self.preset = preset
        self.clock = clock

    # --- queries ------------------------------------------------------------------------------
    @staticmethod
    def presets() -> list[tuple[str, str]]:
        """(name, description) of every preset."""
        return presets.describe_presets()

    def state(self) -> State:
        """The node's current state (read-only), seeding it from the preset when empty."""
        self._check_preset(self.preset)
        try:
            return self.store.ensure(self.preset)
        except SimStateCorruptError as exc:
            raise SimError(str(exc)) from None  # the message names `nodeagent sim reset`
        except SimStateError as exc:
            raise SimError(
                str(exc), "pass --simulate PRESET (or set NODEAGENT_SIMULATE) to create one"
            ) from None

    # --- changes ------------------------------------------------------------------------------
    def reset(self, preset: str | None = None) -> None:
        """Replace the node with a fresh one of ``preset`` (default: the node's current preset)."""
        name = preset or self.preset
        if name is None and self.store.exists():
            try:
                name = str(self.store.read()["preset"])
            except SimStateError:
                name = None  # a corrupt node cannot say what it was
        if name is None:
            raise SimError("no preset to reset to", "pass --simulate PRESET")
        self._check_preset(name)
        self.store.replace(new_state(name, self.clock()))

    def inject(self, kind: str, gpu: int, **args: Unpack[ops.FaultArgs]) -> None:
        """Inject a fault (``ops.FAULT_KINDS``) into GPU ``gpu``; ``args`` as ``ops.FaultArgs``."""
        # Typed for mypy only: a misspelt keyword must still fail at run time, as it did when
        # these were named parameters.
        if unexpected := args.keys() - ops.FaultArgs.__optional_keys__:
            raise TypeError(f"inject() got unexpected keyword arguments {sorted(unexpected)}")
        code, count, function = args.get("code"), args.get("count"), args.get("function")
        if kind not in ops.FAULT_KINDS:
            raise SimError(
                f"unknown fault kind {kind!r}", f"choose one of: {', '.join(ops.FAULT_KINDS)}"
            )
        if kind == "xid" and code is None:
            raise SimError("fault 'xid' needs an XID code", "pass --code, e.g. --code 79")
        if kind == "xid" and code is not None and code < 1:
            raise SimError(
                f"XID {code} is not an XID (the driver numbers them from 1)",
                "pass the XID the driver reports, e.g. --code 79",
            )
        if code is not None and kind not in ("xid", "nvlink-down", "nvlink-errors", "nvml-error"):
            raise SimError(
                f"fault {kind!r} takes no code",
                "--code is for xid, nvlink-down, nvlink-errors and nvml-error",
            )
        if kind == "driver" and not args.get("version"):
            raise SimError("fault 'driver' needs a version", "pass --version, e.g. 570.172.08")
        if count is not None and count < 1:
            raise SimError(f"count {count} must be 1 or more", "pass --count 1 or more")
        if count is not None and kind not in ("pcie-replay", "nvlink-errors"):
            raise SimError(
                f"fault {kind!r} takes no count", "--count is for pcie-replay and nvlink-errors"
            )
        if function is not None and kind != "nvml-error":
            raise SimError(f"fault {kind!r} takes no function", "--function is for nvml-error")
        if kind == "nvml-error":
            self._check_nvml_error(function, code)
        now = self.clock()
        self._change(
            gpu,
            args.get("mig_uuid"),
            lambda s: ops.inject(s, kind, gpu, now, **args),
            f"inject {kind}",
        )

    @staticmethod
    def _check_nvml_error(function: str | None, code: int | None) -> None:
        if function is not None and function not in HANDLE_FUNCTIONS:
            raise SimError(
                f"{function!r} is not an NVML function the simulator models on a GPU handle",
                f"name one such as {ops.NVML_ERROR_FUNCTION} or nvmlDeviceGetTotalEccErrors",
            )
        if code is not None and code <= 0:
            raise SimError(
                f"NVML return code {code} is not an error",
                f"pass an NVML error code, e.g. --code {ops.NVML_ERROR_CODE} (TIMEOUT)",
            )

    def clear(self, gpu: int) -> None:
        """End GPU ``gpu``'s faults; cumulative counters stay."""
        now = self.clock()
        self._change(gpu, None, lambda s: ops.clear(s, gpu, now), what="clear faults")

    def add_process(
        self,
        gpu: int,
        mig_uuid: str | None = None,
        used_memory_mib: int = 1024,
        load: float | None = None,
        pid: int | None = None,
        name: str = ops.DEFAULT_PROCESS_NAME,
        mps: bool = False,
    ) -> int:
        """Attach a compute process to a GPU or to a MIG device; return its PID.

        ``load`` is the share of the GPU's time (SM share) it asks for; where the processes of
        a GPU ask for more than all of it, each gets its share scaled down, as time-slicing
        does. ``pid`` names a process that exists on the host, for tools that look processes
        up; without it the PID is made up. ``mps`` makes it an MPS client.
        """
        if not name or "\0" in name or len(name) > PROCESS_NAME_MAX:
            shown = repr(name) if len(name) <= 60 else f"{name[:40]!r}... ({len(name)} characters)"
            raise SimError(
                f"process name {shown} is not a command name",
                f"pass 1 to {PROCESS_NAME_MAX} characters, e.g. --name python3",
            )
        if used_memory_mib < 0:
            raise SimError(f"used memory {used_memory_mib} MiB is negative", "pass 0 or more")
        if load is not None and not 0.0 <= load <= 1.0:
            raise SimError(f"load {load} is outside 0..1", "pass a fraction such as 0.5")
        if pid is not None and pid <= 0:
            raise SimError(f"PID {pid} is not a process ID", "pass the PID of a running process")
        now = self.clock()
        state = self.state()
        self._check_gpu(state, gpu)
        gpu_state = state["gpus"][gpu]
        if mig_uuid is None and gpu_state["mig"]["current"]:
            raise SimError(
                f"GPU {gpu} has MIG enabled: processes run on MIG devices",
                "pass --mig UUID (list MIG devices with `nodeagent mig show`)",
            )
        attached: int = self._change(
            gpu,
            mig_uuid,
            lambda s: ops.add_process(s, gpu, mig_uuid, used_memory_mib, load, now, pid, name, mps),
            what="add a process",
        )
        return attached

    def remove_process(self, pid: int) -> None:
        """Detach the fake process ``pid``."""
        self.state()
        now = self.clock()
        try:
            self.store.mutate(lambda s: ops.remove_process(s, pid, now))
        except pynvml.NVMLError:
            pids = [p["pid"] for p in self.store.read()["processes"]]
            known = ", ".join(str(p) for p in pids) if pids else "none"
            raise SimError(f"no simulated process {pid}", f"running PIDs: {known}") from None

    def reset_gpu(self, index: int) -> None:
        """What ``nvidia-smi -r`` does: apply the pending MIG mode and wipe instances."""
        now = self.clock()
        self._change(index, None, lambda s: ops.reset_gpu(s, index, now), what="reset")

    def set_mig_mode(self, index: int, enabled: bool) -> None:
        """Request a MIG mode, as ``nvmlDeviceSetMigMode`` does (see ``ops.set_mig_mode``)."""
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        now = self.clock()
        self._change(
            index, None, lambda s: ops.set_mig_mode(s, index, mode, now), what="set MIG mode"
        )

    def set_semantics(self, **flags: bool) -> dict[str, bool]:
        """Switch driver behaviours of this node (``ops.SEMANTICS``); returns them all.

        Raises SimError for a name that is not one of them.
        """
        unknown = sorted(set(flags) - set(ops.SEMANTICS))
        if unknown:
            raise SimError(
                f"unknown semantics {', '.join(unknown)}",
                f"choose from: {', '.join(ops.SEMANTICS)}",
            )
        self.state()

        def change(state: State) -> dict[str, bool]:
            chosen = ops.semantics(state) | {k: bool(v) for k, v in flags.items()}
            state["semantics"] = chosen
            return chosen

        result: dict[str, bool] = self.store.mutate(change)
        return result

    # --- helpers ------------------------------------------------------------------------------
    @staticmethod
    def _check_preset(name: str | None) -> None:
        if name is not None and name not in presets.PRESETS:
            raise SimError(
                f"unknown preset {name!r}", f"choose one of: {', '.join(presets.PRESETS)}"
            )

    @staticmethod
    def _check_gpu(state: State, gpu: int) -> None:
        count = len(state["gpus"])
        if not 0 <= gpu < count:
            raise SimError(f"GPU index {gpu} is out of range", f"this node has GPUs 0..{count - 1}")

    def _change(
        self, gpu: int, mig_uuid: str | None, change: Callable[[State], Any], what: str
    ) -> Any:
        state = self.state()
        self._check_gpu(state, gpu)
        if mig_uuid is not None:
            owners = [
                g["index"]
                for g in state["gpus"]
                for _, ci in ops.mig_devices(g)
                if ci["uuid"] == mig_uuid
            ]
            if not owners:
                raise SimError(
                    f"no MIG device {mig_uuid}", "list MIG devices with `nodeagent mig show`"
                )
            if owners[0] != gpu:
                raise SimError(
                    f"MIG device {mig_uuid} belongs to GPU {owners[0]}, not GPU {gpu}",
                    f"pass --gpu {owners[0]}",
                )
        try:
            return self.store.mutate(change)
        except pynvml.NVMLError as exc:
            reason = _NVML_REASONS.get(exc.value, str(exc))
            raise SimError(
                f"cannot {what} on GPU {gpu}: {reason}", _hint_for(exc.value, gpu)
            ) from None
        except ValueError as exc:
            raise SimError(str(exc), "see `nodeagent sim inject --help`") from None


def reset_gpu(nvml: SimNvml, index: int) -> None:
    """Reset GPU ``index`` of a ``SimNvml`` (for the GPU layer; NVML has no reset call).

    Raises the ``pynvml.NVMLError`` the driver would: IN_USE while processes run.
    """
    nvml.sim_reset_gpu(index)


def _hint_for(code: int, gpu: int) -> str:
    if code == pynvml.NVML_ERROR_IN_USE:
        return f"remove the processes on GPU {gpu} first (`nodeagent sim process remove PID`)"
    if code == pynvml.NVML_ERROR_GPU_IS_LOST:
        return f"recover it with `nodeagent sim clear --gpu {gpu}`"
    if code == pynvml.NVML_ERROR_MEMORY:
        return "pass a smaller --memory-mib (`nodeagent processes` shows what runs there)"
    return "see docs/simulator.md for what each GPU model supports"
