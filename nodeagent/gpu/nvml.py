"""The NVML call point: the only code in nodeagent that calls a ``pynvml`` function.

Every call goes through :meth:`Nvml.call` (or its variants), which names the NVML function,
turns NVML errors into :mod:`nodeagent.gpu.errors` and counts them. The same code runs against
the real ``pynvml`` module and the simulator (which provides the same functions, structs and
errors); which one is chosen by the caller, once, at the edge of the program.
"""

from __future__ import annotations

import ctypes
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from nodeagent.gpu import errors
from nodeagent.gpu.errors import GpuError, GpuLost, InvalidArgument

# NVML reports "not attributed" instance ids (process or event outside MIG) as (unsigned) -1.
NOT_AVAILABLE_UINT = 0xFFFFFFFF
# Answers that mean "no such link/profile here" while enumerating by index.
NO_SUCH_ITEM = errors.ABSENT_CODES | {errors.NVML_ERROR_INVALID_ARGUMENT}
# Answers that leave a reading unknown without being a failure of the device.
UNANSWERED = errors.ABSENT_CODES | {errors.NVML_ERROR_NO_PERMISSION}


def text(value: object) -> str:
    """Decode an NVML string once (pynvml gives ``bytes`` from struct fields, ``str`` elsewhere)."""
    if isinstance(value, bytes):
        return value.split(b"\0", 1)[0].decode("utf-8", "replace").strip()
    return str(value).strip()


def instance_id(value: int) -> int | None:
    """An NVML GI/CI id, or ``None`` where NVML says "not attributed" (all ones)."""
    return None if value == NOT_AVAILABLE_UINT else int(value)


def address(handle: Any) -> int | None:
    """The address behind an NVML handle (a ctypes pointer), to compare handles by identity."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        return None


class Nvml:
    """One initialised NVML module (real ``pynvml`` or the simulator) and its GPU handles.

    Raises the taxonomy error of ``nvmlInit`` when NVML cannot start (DriverNotLoaded without a
    driver); the caller adds what the user can do about it.
    """

    def __init__(self, module: ModuleType | Any) -> None:
        self.module: Any = module
        self.errors_total: Counter[str] = Counter()
        self._pass = threading.local()  # per-thread error counters of the running sample pass
        self._handles: dict[int, Any] = {}
        self._closed = False
        try:
            module.nvmlInit()
        except module.NVMLError as exc:
            raise self.translate(exc, "nvmlInit", None) from exc
        self.count = int(self.call("nvmlDeviceGetCount"))

    # --- errors -------------------------------------------------------------------------------
    def translate(self, exc: Exception, function: str, gpu: int | None) -> GpuError:
        """The taxonomy error for an ``NVMLError`` raised by ``function``."""
        code = int(getattr(exc, "value", errors.NVML_ERROR_UNKNOWN))
        return errors.from_nvml(code, str(exc), function=function, gpu_index=gpu)

    def count_error(self, function: str) -> None:
        """Count a failed call, in the totals and in the running pass."""
        self.errors_total[function] += 1
        current: Counter[str] | None = getattr(self._pass, "errors", None)
        if current is not None:
            current[function] += 1

    @contextmanager
    def error_pass(self) -> Iterator[Counter[str]]:
        """Count the errors of one sample pass on this thread (the snapshot's ``nvml_errors``)."""
        counter: Counter[str] = Counter()
        self._pass.errors = counter
        try:
            yield counter
        finally:
            self._pass.errors = None

    @contextmanager
    def soft_errors(self) -> Iterator[list[str]]:
        """Within the block, a failed optional reading is ``None`` and its error is listed."""
        found: list[str] = []
        self._pass.soft_errors = found
        try:
            yield found
        finally:
            self._pass.soft_errors = None

    # --- calls --------------------------------------------------------------------------------
    def call(self, function: str, *args: Any, gpu: int | None = None) -> Any:
        """Call ``nvml.<function>(*args)``; NVML errors become the taxonomy (and are counted)."""
        try:
            return getattr(self.module, function)(*args)
        except self.module.NVMLError as exc:
            self.count_error(function)
            raise self.translate(exc, function, gpu) from exc

    def attempt(
        self, function: str, *args: Any, gpu: int | None, expected: frozenset[int]
    ) -> tuple[Any, int]:
        """Call, returning ``(result, 0)``, or ``(None, code)`` for an ``expected`` NVML code.

        Expected codes are answers, not failures (a reading the device lacks, the end of an
        enumeration), so they are neither raised nor counted; any other code still raises.
        """
        try:
            return getattr(self.module, function)(*args), errors.NVML_SUCCESS
        except self.module.NVMLError as exc:
            code = int(getattr(exc, "value", errors.NVML_ERROR_UNKNOWN))
            if code in expected:
                return None, code
            self.count_error(function)
            raise self.translate(exc, function, gpu) from exc

    def optional(self, function: str, *args: Any, gpu: int | None = None) -> Any:
        """Like :meth:`call`, but a reading the device does not offer is ``None``.

        Inside :meth:`soft_errors`, a reading that fails for another reason is also ``None`` and
        its error is noted: one broken sensor must not blank every other reading of the GPU. A
        lost GPU still raises.
        """
        try:
            return self.attempt(function, *args, gpu=gpu, expected=errors.ABSENT_CODES)[0]
        except GpuLost:
            raise
        except GpuError as exc:
            soft: list[str] | None = getattr(self._pass, "soft_errors", None)
            if soft is None:
                raise
            soft.append(str(exc))
            return None

    def try_call(self, function: str, *args: Any, gpu: int | None = None) -> bool:
        """Run a call whose NOT_SUPPORTED just means "skip": True when it succeeded."""
        _, code = self.attempt(function, *args, gpu=gpu, expected=errors.ABSENT_CODES)
        return code == errors.NVML_SUCCESS

    def const(self, name: str, default: int) -> int:
        """An NVML constant of the module, or ``default`` where an older binding lacks it."""
        return int(getattr(self.module, name, default))

    def handle(self, index: int) -> Any:
        """The device handle of GPU ``index`` (NVML hands out one fixed handle per device)."""
        if not 0 <= index < self.count:
            raise InvalidArgument(
                f"GPU index {index} does not exist; this node has GPUs 0..{self.count - 1}",
                gpu_index=index,
                nvml_code=errors.NVML_ERROR_INVALID_ARGUMENT,
            )
        handle = self._handles.get(index)
        if handle is None:
            handle = self.call("nvmlDeviceGetHandleByIndex", index, gpu=index)
            self._handles[index] = handle
        return handle

    def handles(self) -> dict[int, Any]:
        """The handles fetched so far, by GPU index."""
        return dict(self._handles)

    def close(self) -> None:
        """Shut NVML down (once)."""
        if self._closed:
            return
        self._closed = True
        self.call("nvmlShutdown")
