"""The GPU layer's error taxonomy: every NVML error becomes one of these.

Callers above :mod:`nodeagent.gpu` catch these, never ``pynvml.NVMLError``.
"""

from __future__ import annotations


class GpuError(Exception):
    """Base class: an NVML call failed.

    Attributes:
        function: the NVML function that failed (``nvmlDeviceGetPowerUsage``).
        gpu_index: the GPU it was called on, when there was one.
        nvml_code: NVML's numeric return code.
    """

    def __init__(
        self, message: str, *, function: str = "", gpu_index: int | None = None, nvml_code: int = 0
    ) -> None:
        super().__init__(message)
        self.function = function
        self.gpu_index = gpu_index
        self.nvml_code = nvml_code


class DriverNotLoaded(GpuError):
    """No NVIDIA driver or NVML library on this host (and no ``--simulate``)."""


class NotSupported(GpuError):
    """The device does not support the call (a non-MIG GPU asked for MIG, say)."""


class GpuLost(GpuError):
    """The GPU fell off the bus or stopped answering (GPU_IS_LOST, or UNKNOWN on one handle)."""


class InUse(GpuError):
    """Something is running there: processes or compute instances block the change."""


class InsufficientResources(GpuError):
    """The instance does not fit: overlap, or the profile's capacity is exhausted."""


class PermissionDenied(GpuError):
    """The call needs root (NO_PERMISSION)."""


class NotFound(GpuError):
    """The instance or device asked for does not exist (NOT_FOUND)."""


class InvalidArgument(GpuError):
    """NVML rejected an argument (an illegal placement, an unknown profile)."""


class ResetRequired(GpuError):
    """The change takes effect only after a GPU reset (or a reboot under passthrough)."""


class Transient(GpuError):
    """A failure worth retrying: timeouts, busy driver, interrupted calls."""
