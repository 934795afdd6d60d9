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


class DriverNotLoaded(GpuError):  # noqa: N818 - contract names
    """No NVIDIA driver or NVML library on this host (and no ``--simulate``)."""


class NotSupported(GpuError):  # noqa: N818 - contract names
    """The device does not support the call (a non-MIG GPU asked for MIG, say)."""


class GpuLost(GpuError):  # noqa: N818 - contract names
    """The GPU fell off the bus or stopped answering (GPU_IS_LOST, or UNKNOWN on one handle)."""


class InUse(GpuError):  # noqa: N818 - contract names
    """Something is running there: processes or compute instances block the change."""


class InsufficientResources(GpuError):  # noqa: N818 - contract names
    """The instance does not fit: overlap, or the profile's capacity is exhausted."""


class PermissionDenied(GpuError):  # noqa: N818 - contract names
    """The call needs root (NO_PERMISSION)."""


class NotFound(GpuError):  # noqa: N818 - contract names
    """The instance or device asked for does not exist (NOT_FOUND)."""


class InvalidArgument(GpuError):  # noqa: N818 - contract names
    """NVML rejected an argument (an illegal placement, an unknown profile)."""


class ResetRequired(GpuError):  # noqa: N818 - contract names
    """The change takes effect only after a GPU reset (or a reboot under passthrough)."""


class Transient(GpuError):  # noqa: N818 - contract names
    """A failure worth retrying: timeouts, busy driver, interrupted calls."""


# NVML return codes (nvml.h ``nvmlReturn_t``; the same numbers in pynvml and the simulator), kept
# as literals so translation works even where the pynvml module could not be imported.
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_NOT_READY = 27
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_UNKNOWN = 999

# The one mapping from an NVML return code to the taxonomy. Codes not listed become GpuError.
_CODE_TO_CLASS: dict[int, type[GpuError]] = {
    NVML_ERROR_INVALID_ARGUMENT: InvalidArgument,
    NVML_ERROR_NOT_SUPPORTED: NotSupported,
    # The installed driver lacks the entry point (older than the pynvml binding) or the struct
    # version: for the caller that is the same as the device not supporting the reading.
    NVML_ERROR_FUNCTION_NOT_FOUND: NotSupported,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH: NotSupported,
    NVML_ERROR_NO_PERMISSION: PermissionDenied,
    NVML_ERROR_OPERATING_SYSTEM: PermissionDenied,
    NVML_ERROR_NOT_FOUND: NotFound,
    NVML_ERROR_DRIVER_NOT_LOADED: DriverNotLoaded,
    NVML_ERROR_LIBRARY_NOT_FOUND: DriverNotLoaded,
    # Kernel module and user-space library differ (driver upgraded without reboot): NVML is
    # unusable until the host is fixed, like a missing driver.
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: DriverNotLoaded,
    NVML_ERROR_GPU_IS_LOST: GpuLost,
    NVML_ERROR_GPU_NOT_FOUND: GpuLost,
    NVML_ERROR_RESET_REQUIRED: ResetRequired,
    NVML_ERROR_IN_USE: InUse,
    NVML_ERROR_INSUFFICIENT_RESOURCES: InsufficientResources,
    NVML_ERROR_TIMEOUT: Transient,
    NVML_ERROR_IRQ_ISSUE: Transient,
    NVML_ERROR_MEMORY: Transient,
    NVML_ERROR_NOT_READY: Transient,
}

# Codes for which a reading is simply absent on this device (the caller gets ``None``).
ABSENT_CODES = frozenset(
    {NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_ARGUMENT_VERSION_MISMATCH}
)


def error_class(code: int, *, on_device: bool) -> type[GpuError]:
    """The taxonomy class for an NVML return code.

    ``on_device`` says the call was made on one GPU's handle: there NVML's catch-all UNKNOWN
    means the GPU stopped answering (the driver reports it so before it marks the GPU lost).
    """
    if code == NVML_ERROR_UNKNOWN and on_device:
        return GpuLost
    return _CODE_TO_CLASS.get(code, GpuError)


def from_nvml(
    code: int, description: str, *, function: str, gpu_index: int | None = None
) -> GpuError:
    """Build the taxonomy error for a failed NVML call, with a one-line message."""
    where = f" on GPU {gpu_index}" if gpu_index is not None else ""
    cls = error_class(code, on_device=gpu_index is not None)
    return cls(
        f"{function}{where} failed: {description} (NVML error {code})",
        function=function,
        gpu_index=gpu_index,
        nvml_code=code,
    )
