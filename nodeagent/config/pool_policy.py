"""Pool policy: what a pool of nodes wants from its GPUs.

A node belongs to one pool (``node.pool`` in the agent config, or the node label named by
``node.pool_label``). The pool names a MIG layout, the sharing mode of each GPU, health
thresholds and the driver version the pool expects.
"""

from __future__ import annotations

import enum
import re
from typing import Annotated, Literal, Self

from pydantic import AfterValidator, Field, model_validator

from nodeagent.config.dra import PoolDra
from nodeagent.config.errors import FieldError
from nodeagent.config.loader import Schema

# Time-slicing has no limit of its own, but every replica is one more device ID the plugin
# lists to the kubelet on every health change (x7 MIG devices per GPU with `mixed`), and each
# process on a GPU holds a context of a few hundred MiB: beyond 128 replicas a GPU only gains
# IDs no workload can use.
MAX_REPLICAS = 128
# An MPS server accepts at most 48 client contexts per GPU on Volta and later (NVIDIA's MIG user
# guide, "CUDA MPS on top of MIG": "the maximum number of clients (48) is lowered proportionally
# to the Compute Instance size"); replicas beyond that are advertised to pods that then fail.
MAX_MPS_REPLICAS = 48
MAX_PINNED_MEMORY_MIB = 1024 * 1024  # 1 TiB per replica: above any GPU's memory

_GPU_REF = re.compile(r"^(\d{1,4}|(GPU|MIG)-[0-9A-Za-z][0-9A-Za-z/-]*)$")


def gpu_ref(text: str) -> str:
    """A GPU named by index (``"3"``) or UUID (``GPU-...``, ``MIG-...``)."""
    if not _GPU_REF.match(text):
        raise ValueError(f'{text!r} names no GPU; use its index ("3") or UUID (GPU-...)')
    return text


GpuRef = Annotated[str, AfterValidator(gpu_ref)]


class SharingMode(enum.StrEnum):
    """How one GPU (or each MIG device on it) is shared between containers."""

    EXCLUSIVE = "exclusive"  # one container per device
    TIME_SLICING = "time-slicing"  # N replicas of the device, interleaved by the driver
    MPS = "mps"  # N replicas sharing the device through an MPS control daemon


class ReplicaPlacement(enum.StrEnum):
    """Where the device plugin prefers replicas when a pod asks for several."""

    SPREAD = "spread"  # across physical GPUs (fewest co-tenants)
    PACK = "pack"  # on as few physical GPUs as possible


class Sharing(Schema):
    """Sharing settings for one GPU or a default for all."""

    mode: SharingMode = Field(SharingMode.EXCLUSIVE, description="exclusive, time-slicing or mps")
    replicas: int = Field(
        1,
        ge=1,
        le=MAX_REPLICAS,
        description=f"devices advertised per physical device (time-slicing; at most "
        f"{MAX_MPS_REPLICAS} with mps, an MPS server's client limit)",
    )
    rename_shared: bool = Field(
        False, description="advertise `<resource>.shared` for shared devices"
    )
    fail_requests_greater_than_one: bool = Field(
        False, description="reject a pod asking for >1 replica"
    )
    mps_active_thread_percentage: int | None = Field(
        None, ge=1, le=100, description="per replica; default 100 / replicas"
    )
    mps_pinned_memory_limit_mib: int | None = Field(
        None, ge=1, le=MAX_PINNED_MEMORY_MIB, description="per replica; default memory / replicas"
    )
    replica_placement: ReplicaPlacement = Field(
        ReplicaPlacement.SPREAD, description="for multi-replica requests"
    )

    @model_validator(mode="after")
    def _replicas_fit_the_mode(self) -> Self:
        found = FieldError()
        if self.mode is SharingMode.EXCLUSIVE and self.replicas != 1:
            found.add("replicas", "replicas > 1 needs mode time-slicing or mps")
        if self.mode is SharingMode.MPS and self.replicas > MAX_MPS_REPLICAS:
            found.add(
                "replicas",
                f"at most {MAX_MPS_REPLICAS} with mode mps (an MPS server's client limit), "
                f"got {self.replicas}",
            )
        found.raise_any()
        return self


RemediationStep = Literal["reset", "validate"]


class RemediationPolicy(Schema):
    """What the agent does before a GPU whose fault cleared serves again (off by default)."""

    enabled: bool = Field(
        False,
        description="hold a GPU whose unhealthy fault cleared until its steps pass",
    )
    steps: tuple[RemediationStep, ...] = Field(
        ("validate",), min_length=1, description="in order: reset (the GPU) and validate"
    )
    validate_command: tuple[str, ...] = Field(
        (),
        description="argv of a short diagnostic, run with CUDA_VISIBLE_DEVICES set to the GPU; "
        "exit 0 passes; empty: the validate step passes at once",
    )
    validate_timeout_s: float = Field(300.0, ge=1, le=3600, description="a longer run fails")
    allow_reset: bool = Field(
        False, description="the reset step may reset the GPU (never while a process runs)"
    )
    max_resets: int = Field(1, ge=0, le=100, description="GPU resets per reset_period_s, node-wide")
    reset_period_s: float = Field(86400.0, ge=60, le=30 * 86400, description="the cap's period")
    retry_s: float = Field(
        300.0, ge=1, le=86400, description="a GPU whose steps failed is tried again after this"
    )


class SharingActionsPolicy(Schema):
    """What a pool does about a shared GPU that stays noisy (off by default)."""

    enabled: bool = Field(False, description="act on sustained interference of a shared GPU")
    dry_run: bool = Field(False, description="log what would be done, change nothing")
    interference_threshold: float = Field(
        0.5, gt=0, le=1, description="interference ratio at or above which a GPU is noisy"
    )
    memory_pressure_threshold: float = Field(
        0.95, gt=0, le=1, description="memory pressure at or above which a GPU is noisy"
    )
    for_s: float = Field(900.0, ge=0, le=86400, description="how long it must stay noisy")
    action: Literal["cap-replicas", "exclusive"] = Field(
        "cap-replicas", description="cap its replicas, or make it exclusive"
    )
    cap_replicas: int = Field(2, ge=1, le=MAX_REPLICAS, description="replicas after a cap")


class PoolPolicy(Schema):
    """What one pool wants."""

    mig_layout: str | None = Field(
        None,
        min_length=1,
        description="a config name in the MIG layout file; None leaves MIG alone",
    )
    sharing: Sharing = Field(default_factory=Sharing, description="default for every GPU")
    gpu_sharing: dict[GpuRef, Sharing] = Field(
        default_factory=dict,
        description='per-GPU overrides, keyed by GPU index ("3") or UUID; an index the node '
        "lacks stops the agent at start",
        json_schema_extra={"placeholder": "gpu"},
    )
    expected_driver_version: str | None = Field(
        None, min_length=1, description="drift is flagged when the node differs"
    )
    request_sizes: tuple[str, ...] = Field(
        (), description='MIG profiles / "gpu" sizes the pool\'s jobs ask for'
    )
    mig_partial_apply: bool = Field(
        False, description="apply the layout to the other GPUs while a busy one waits"
    )
    remediation: RemediationPolicy = Field(default_factory=RemediationPolicy)
    sharing_actions: SharingActionsPolicy = Field(default_factory=SharingActionsPolicy)
    dra: PoolDra = Field(default_factory=PoolDra, description="the DRA plugin's pool policy")

    @model_validator(mode="after")
    def _dynamic_mig_owns_the_instances(self) -> Self:
        if self.dra.dynamic_mig and self.mig_layout is not None:
            found = FieldError()
            found.add(
                ("dra", "dynamic_mig"),
                f"the DRA driver creates this pool's MIG instances, but mig_layout "
                f"{self.mig_layout!r} would make the reconciler destroy them; unset mig_layout "
                "(turn MIG mode on once with `nodeagent mig apply --config all-enabled`)",
            )
            found.raise_any()
        return self

    def sharing_for(self, index: int, uuid: str) -> Sharing:
        """The sharing settings of one GPU: per-GPU override by UUID or index, else default."""
        return self.gpu_sharing.get(uuid) or self.gpu_sharing.get(str(index)) or self.sharing
