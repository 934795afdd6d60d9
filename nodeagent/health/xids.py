"""The XID catalog: what each XID means, how bad it is, and what to do about it.

The table is data: one row per XID from the reference notes (NVIDIA's XID catalog as bundled by
NVSentinel, cross-checked with Azure NHC, the NVIDIA and GKE device plugins and DCGM). Operators
override it with ``health.ignore_xids`` and ``health.fatal_xids`` in the agent config, the way
NVIDIA's device plugin takes ``DP_DISABLE_HEALTHCHECKS`` / ``DP_ENABLE_HEALTHCHECKS``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from nodeagent.runtime.health_source import HealthState


class XidCategory(enum.StrEnum):
    """Where the fault lies."""

    APPLICATION = "application"  # the program did something wrong; the GPU is fine
    MEMORY = "memory"  # HBM/DRAM ECC, row remapping, page retirement
    INTERCONNECT = "interconnect"  # NVLink, NVSwitch, PCIe
    DRIVER_FIRMWARE = "driver/firmware"  # driver, GSP, PMU, timeouts in the driver
    FATAL_HARDWARE = "fatal hardware"  # the GPU is gone or its state cannot be trusted
    UNKNOWN = "unknown"  # not in the catalog


class Action(enum.StrEnum):
    """The recommended action, mildest first (the order is used to pick the strongest)."""

    NONE = "none"
    RESTART_APP = "restart the application"
    RESET_GPU = "reset the GPU"
    REBOOT_NODE = "reboot the node"
    DRAIN_INVESTIGATE = "drain and investigate"

    @property
    def rank(self) -> int:
        """Position in the escalation order (higher is stronger)."""
        return _ACTION_ORDER.index(self)


_ACTION_ORDER = list(Action)


def strongest(actions: Iterable[Action]) -> Action:
    """The strongest of ``actions`` (``Action.NONE`` when empty)."""
    return max(actions, key=lambda a: a.rank, default=Action.NONE)


@dataclass(frozen=True, slots=True)
class XidInfo:
    """One catalog row."""

    code: int
    mnemonic: str
    meaning: str
    category: XidCategory
    action: Action
    state: HealthState  # what the device becomes when the XID arrives


_H = HealthState
_C = XidCategory
_A = Action

# One row per XID in the reference notes. The action column follows NVIDIA's "immediate action"
# bucket (RESTART_APP -> restart the application, RESET_GPU -> reset the GPU, RESTART_BM -> reboot
# the node, WORKFLOW_* and FATAL report-issue rows -> drain and investigate); the state column
# says whether the device may keep taking work (NVIDIA's device plugin treats 13/31/43/45/68/109
# as non-fatal; we keep 109 fatal as the catalog does).
_ROWS: tuple[XidInfo, ...] = (
    # 13: a shader/graphics-engine exception raised by the program (bad index, illegal instr).
    XidInfo(
        13, "GR_EXCEPTION", "graphics engine exception", _C.APPLICATION, _A.RESTART_APP, _H.HEALTHY
    ),
    # 31: MMU fault: the program touched memory it does not own; the GPU is fine.
    XidInfo(
        31,
        "FIFO_ERROR_MMU_ERR_FLT",
        "GPU memory page fault",
        _C.APPLICATION,
        _A.RESTART_APP,
        _H.HEALTHY,
    ),
    # 43: the driver reset a channel after an application fault; informational.
    XidInfo(
        43,
        "RESETCHANNEL_VERIF_ERROR",
        "GPU stopped processing (channel reset)",
        _C.APPLICATION,
        _A.NONE,
        _H.HEALTHY,
    ),
    # 45: preemptive cleanup after a fault elsewhere; a known predictor of node trouble, so it
    # degrades the device (schedulable) rather than being ignored.
    XidInfo(
        45,
        "PREEMPTIVE_REMOVAL",
        "preemptive cleanup due to previous errors",
        _C.APPLICATION,
        _A.RESTART_APP,
        _H.DEGRADED,
    ),
    # 46: the GPU stopped responding to the driver; needs a reset.
    XidInfo(
        46,
        "GPU_TIMEOUT_ERROR",
        "GPU stopped responding",
        _C.DRIVER_FIRMWARE,
        _A.RESET_GPU,
        _H.UNHEALTHY,
    ),
    # 48: uncorrectable (double-bit) ECC error; a drain-worthy XID in every operator's list.
    XidInfo(
        48, "GPU_ECC_DBE", "double-bit ECC error", _C.MEMORY, _A.DRAIN_INVESTIGATE, _H.UNHEALTHY
    ),
    # 62: the PMU (power management microcontroller) halted.
    XidInfo(
        62,
        "PMU_HALT_ERROR",
        "internal micro-controller halt",
        _C.DRIVER_FIRMWARE,
        _A.RESET_GPU,
        _H.UNHEALTHY,
    ),
    # 63: a row was marked for remapping (Ampere+) or a page retired (older): works until the
    # next reset; the remap-pending check on the snapshot asks for the reset.
    XidInfo(
        63,
        "INFOROM_DRAM_RETIREMENT_EVENT",
        "row remap pending / page retired",
        _C.MEMORY,
        _A.NONE,
        _H.DEGRADED,
    ),
    # 64: the remap or retirement could not be recorded.
    XidInfo(
        64,
        "INFOROM_DRAM_RETIREMENT_FAILURE",
        "row remap / page retirement failure",
        _C.MEMORY,
        _A.RESET_GPU,
        _H.UNHEALTHY,
    ),
    # 68: video decoder exception; NVIDIA's device plugin treats it as non-fatal.
    XidInfo(
        68, "NVDEC_ERROR", "video processor exception", _C.APPLICATION, _A.RESTART_APP, _H.HEALTHY
    ),
    # 74: NVLink error; the link may be down or retraining.
    XidInfo(
        74, "NVLINK_ERROR", "NVLink error", _C.INTERCONNECT, _A.DRAIN_INVESTIGATE, _H.UNHEALTHY
    ),
    # 79: the GPU fell off the bus: only a reboot brings it back (RESTART_BM).
    XidInfo(
        79,
        "GPU_HAS_FALLEN_OFF_THE_BUS",
        "GPU has fallen off the bus",
        _C.FATAL_HARDWARE,
        _A.REBOOT_NODE,
        _H.LOST,
    ),
    # 92: a high rate of corrected (single-bit) errors; informational, keep an eye on it.
    XidInfo(
        92,
        "EXCESSIVE_SBE_INTERRUPTS",
        "high single-bit ECC error rate",
        _C.MEMORY,
        _A.NONE,
        _H.DEGRADED,
    ),
    # 94: contained ECC error: only the affected application died.
    XidInfo(94, "CONTAINED_ERROR", "contained ECC error", _C.MEMORY, _A.RESTART_APP, _H.HEALTHY),
    # 95: uncontained ECC error: every application on the GPU is affected; reset it.
    XidInfo(
        95,
        "UNCONTAINED_ERROR",
        "uncontained ECC error",
        _C.FATAL_HARDWARE,
        _A.RESET_GPU,
        _H.UNHEALTHY,
    ),
    # 109: context-switch timeout; the catalog says reset although the device plugin skips it.
    XidInfo(
        109,
        "CTXSW_TIMEOUT_ERROR",
        "context switch timeout",
        _C.DRIVER_FIRMWARE,
        _A.RESET_GPU,
        _H.UNHEALTHY,
    ),
    # 119/120: the GSP firmware stopped answering or failed (GSP is the most failure-prone part).
    XidInfo(
        119, "GSP_RPC_TIMEOUT", "GSP RPC timeout", _C.DRIVER_FIRMWARE, _A.RESET_GPU, _H.UNHEALTHY
    ),
    XidInfo(120, "GSP_ERROR", "GSP error", _C.DRIVER_FIRMWARE, _A.RESET_GPU, _H.UNHEALTHY),
    # 136: NVLink ALI training failed.
    XidInfo(
        136,
        "ALI_TRAINING_FAIL",
        "NVLink link training failure",
        _C.INTERCONNECT,
        _A.RESET_GPU,
        _H.UNHEALTHY,
    ),
    # 140: an uncorrectable ECC error escaped containment.
    XidInfo(
        140,
        "UNRECOVERABLE_ECC_ERROR_ESCAPE",
        "unrecoverable ECC error escape",
        _C.MEMORY,
        _A.RESET_GPU,
        _H.UNHEALTHY,
    ),
    # 143: the GPU failed to initialise.
    XidInfo(
        143,
        "GPU_INIT_ERROR",
        "GPU initialisation failure",
        _C.DRIVER_FIRMWARE,
        _A.RESET_GPU,
        _H.UNHEALTHY,
    ),
    # 144-150: NVLink5 (Blackwell) link-layer errors; NVIDIA's workflow is drain and diagnose.
    XidInfo(
        144,
        "NVLINK_SAW_ERROR",
        "NVLink5 SAW error",
        _C.INTERCONNECT,
        _A.DRAIN_INVESTIGATE,
        _H.UNHEALTHY,
    ),
    XidInfo(
        145,
        "NVLINK_RLW_ERROR",
        "NVLink5 RLW error",
        _C.INTERCONNECT,
        _A.DRAIN_INVESTIGATE,
        _H.UNHEALTHY,
    ),
    XidInfo(
        146,
        "NVLINK_TLW_ERROR",
        "NVLink5 TLW error",
        _C.INTERCONNECT,
        _A.DRAIN_INVESTIGATE,
        _H.UNHEALTHY,
    ),
    XidInfo(
        147,
        "NVLINK_TREX_ERROR",
        "NVLink5 TREX error",
        _C.INTERCONNECT,
        _A.DRAIN_INVESTIGATE,
        _H.UNHEALTHY,
    ),
    XidInfo(
        148,
        "NVLINK_NVLPW_CTRL_ERROR",
        "NVLink5 power control error",
        _C.INTERCONNECT,
        _A.DRAIN_INVESTIGATE,
        _H.UNHEALTHY,
    ),
    XidInfo(
        149,
        "NVLINK_NETIR_ERROR",
        "NVLink5 NETIR error",
        _C.INTERCONNECT,
        _A.DRAIN_INVESTIGATE,
        _H.UNHEALTHY,
    ),
    XidInfo(
        150,
        "NVLINK_MSE_ERROR",
        "NVLink5 MSE error",
        _C.INTERCONNECT,
        _A.DRAIN_INVESTIGATE,
        _H.UNHEALTHY,
    ),
    # 154: the driver's recommended recovery action changed; it follows another XID, which
    # carries the real fault, so this one only degrades.
    XidInfo(
        154,
        "GPU_RECOVERY_ACTION_CHANGED",
        "GPU recovery action changed",
        _C.DRIVER_FIRMWARE,
        _A.NONE,
        _H.DEGRADED,
    ),
    # 155/156/158: further fatal faults in the catalog's RESET_GPU bucket.
    XidInfo(
        155,
        "SOFTWARE_INDUCED_FAULT",
        "fault induced by driver software",
        _C.DRIVER_FIRMWARE,
        _A.RESET_GPU,
        _H.UNHEALTHY,
    ),
    XidInfo(
        156,
        "RESOURCE_RETIREMENT_EVENT",
        "resource retirement event",
        _C.FATAL_HARDWARE,
        _A.RESET_GPU,
        _H.UNHEALTHY,
    ),
    XidInfo(
        158,
        "GPU_FATAL_TIMEOUT",
        "GPU fatal timeout",
        _C.DRIVER_FIRMWARE,
        _A.RESET_GPU,
        _H.UNHEALTHY,
    ),
    # 160: channel retirement: the catalog asks for a node reboot (RESTART_BM).
    XidInfo(
        160,
        "CHANNEL_RETIREMENT_EVENT",
        "channel retirement event",
        _C.FATAL_HARDWARE,
        _A.REBOOT_NODE,
        _H.UNHEALTHY,
    ),
)

CATALOG: Mapping[int, XidInfo] = {row.code: row for row in _ROWS}


def unknown_xid(code: int) -> XidInfo:
    """The row for an XID not in the catalog.

    NVIDIA's catalog maps unused and legacy XIDs to "report issue / fatal", and NVIDIA's device
    plugin marks a device unhealthy on any XID outside its non-fatal list: an unknown XID is
    treated as a fault that needs a look, not ignored.
    """
    return XidInfo(
        code,
        "UNKNOWN",
        f"XID {code} (not in the catalog)",
        _C.UNKNOWN,
        _A.DRAIN_INVESTIGATE,
        _H.UNHEALTHY,
    )


@dataclass(frozen=True, slots=True)
class XidPolicy:
    """The catalog with the operator's overrides applied."""

    ignore: frozenset[int] = frozenset()  # XIDs counted but never change health
    fatal: frozenset[int] = frozenset()  # XIDs that always make the device unhealthy

    def __post_init__(self) -> None:
        both = self.ignore & self.fatal
        if both:
            listed = ", ".join(str(c) for c in sorted(both))
            raise ValueError(f"XIDs {listed} are both ignored and fatal; keep each in one list")

    def lookup(self, code: int) -> XidInfo | None:
        """The effective row for ``code``; ``None`` when the operator ignores it."""
        if code in self.ignore:
            return None
        info = CATALOG.get(code) or unknown_xid(code)
        if code in self.fatal and info.state in (HealthState.HEALTHY, HealthState.DEGRADED):
            # Fatal by policy: the device stops taking work and gets at least a reset.
            action = strongest((info.action, Action.RESET_GPU))
            return replace(info, state=HealthState.UNHEALTHY, action=action)
        return info

    def scope_is_gpu(self, info: XidInfo) -> bool:
        """Whether an XID attributed to a MIG instance still marks the whole GPU.

        Faults that leave the GPU itself untrustworthy (fallen off the bus, uncontained errors)
        or that need a reboot or a drain hit every instance on it.
        """
        return (
            info.category is XidCategory.FATAL_HARDWARE
            or info.action.rank >= Action.REBOOT_NODE.rank
        )
