"""Every name nodeagent puts on a Kubernetes object, and the one label-value sanitiser.

CONTRACT FILE: the agent writes these labels, annotations, the condition and the taints, and the
tiering service reads them; both sides take the names from here, so they cannot drift apart.

The capability label names follow NVIDIA GPU feature discovery (GFD) where GFD has one, so
selectors written for GFD keep working; facts GFD does not publish live under ``nodeagent.io/``.
The capability labels are a pure function of a :class:`NodeSnapshot` plus the pool and health
facts the agent already holds; :func:`label_patch` tells the agent whether anything changed, so
it patches only on change.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from nodeagent.capacity import nvlink_components
from nodeagent.gpu.types import NodeSnapshot

# GPU feature discovery names (kept as GFD spells them).
GPU_PRODUCT = "nvidia.com/gpu.product"  # product name, spaces as dashes
GPU_MEMORY = "nvidia.com/gpu.memory"  # MiB per GPU
GPU_COUNT = "nvidia.com/gpu.count"
GPU_FAMILY = "nvidia.com/gpu.family"  # architecture: ampere, hopper...
GPU_COMPUTE_MAJOR = "nvidia.com/gpu.compute.major"
GPU_COMPUTE_MINOR = "nvidia.com/gpu.compute.minor"
MIG_CAPABLE = "nvidia.com/mig.capable"  # "true" / "false"
MIG_STRATEGY = "nvidia.com/mig.strategy"  # none | single | mixed
CUDA_DRIVER_MAJOR = "nvidia.com/cuda.driver.major"  # GFD: the driver version, split
CUDA_DRIVER_MINOR = "nvidia.com/cuda.driver.minor"
CUDA_DRIVER_REV = "nvidia.com/cuda.driver.rev"
CUDA_RUNTIME_MAJOR = "nvidia.com/cuda.runtime.major"  # GFD: the CUDA version the driver offers
CUDA_RUNTIME_MINOR = "nvidia.com/cuda.runtime.minor"

PREFIX = "nodeagent.io/"

# nodeagent's own labels.
POOL = PREFIX + "pool"
GPU_HEALTH = PREFIX + "gpu-health"  # worst device state: healthy|degraded|unhealthy|lost
STABILITY = PREFIX + "stability"  # stable | degraded | unstable
NVLINK_LARGEST_SET = PREFIX + "nvlink-largest-set"  # GPUs in the largest NVLink island
DRIVER_VERSION = PREFIX + "driver-version"  # full driver version, e.g. 550.54.15
MIG_LAYOUT = PREFIX + "mig-layout"  # the pool's MIG layout, once the agent applied it
TIER = PREFIX + "tier"  # written by the tiering service, never by the agent

# Capacity annotations the agent publishes for the pool review when no Prometheus is at hand.
FRAGMENTATION_ANNOTATION = PREFIX + "fragmentation"  # mean ratio 0..1 over MIG GPUs
STRANDED_SLICES_ANNOTATION = PREFIX + "stranded-mig-slices"
STRANDED_GPUS_ANNOTATION = PREFIX + "stranded-gpus"
# Every GPU's model, health, NVLink island and MIG instances, for the tiering service's
# pending-workload diagnosis (JSON, versioned; the codec is nodeagent.published).
GPU_STATE_ANNOTATION = PREFIX + "gpu-state"

# On a workload (pod label or annotation): the GPU topology it needs, "nvlink" (one
# NVLink-connected set) or "numa" (one NUMA node). The tier policy's pending.topology_key
# names the key; this is its default.
GPU_TOPOLOGY = PREFIX + "gpu-topology"

# The health reporter's annotations, condition and taint.
STABILITY_SCORE_ANNOTATION = PREFIX + "stability-score"  # the node's stability score, 1 decimal
HEALTH_REASONS_ANNOTATION = PREFIX + "health-reasons"  # JSON list of the node's reasons
GPU_HEALTHY_CONDITION = "GPUHealthy"  # node condition type: False when a GPU must not take work
UNSTABLE_TAINT = PREFIX + "unstable"  # NoSchedule, with health.taint_unstable

# The tiering service's own: its drain record, its lease annotation, its quarantine taint.
DRAIN_ANNOTATION = PREFIX + "drain"  # JSON progress of a drain (read back by a new leader)
# JSON progress of single-GPU remediations on a node: the pods of one faulty GPU evicted.
GPU_REMEDIATION_ANNOTATION = PREFIX + "gpu-remediation"
BREAKER_ANNOTATION = PREFIX + "circuit-breaker"  # on the service's Lease
QUARANTINE_TAINT = PREFIX + "quarantine"  # the default drain.taint_key

# The Kueue objects the tiering service writes (flavors, queues, cohorts): the recommended
# Kubernetes label marks them as nodeagent's, so it never touches one it did not make; TEAM and
# TIER on them say which team and tier a queue serves.
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "nodeagent"
TEAM = PREFIX + "team"
GPU_PRODUCT_FLAVOR = PREFIX + "gpu-product"  # on a per-product flavor: the product it selects
# Kueue's own label: the LocalQueue a pod or Job is submitted to.
KUEUE_QUEUE_NAME = "kueue.x-k8s.io/queue-name"

# Every label the agent owns: a key here that the agent no longer computes is removed.
# The health reporter writes GPU_HEALTH, STABILITY and DRIVER_VERSION itself (same names).
AGENT_LABELS: tuple[str, ...] = (
    GPU_PRODUCT,
    GPU_MEMORY,
    GPU_COUNT,
    GPU_FAMILY,
    GPU_COMPUTE_MAJOR,
    GPU_COMPUTE_MINOR,
    MIG_CAPABLE,
    MIG_STRATEGY,
    CUDA_DRIVER_MAJOR,
    CUDA_DRIVER_MINOR,
    CUDA_DRIVER_REV,
    CUDA_RUNTIME_MAJOR,
    CUDA_RUNTIME_MINOR,
    POOL,
    GPU_HEALTH,
    STABILITY,
    NVLINK_LARGEST_SET,
    DRIVER_VERSION,
    MIG_LAYOUT,
)

# Compute capability major -> GFD family name (minor distinguishes Ada from Ampere).
_FAMILIES: dict[tuple[int, int], str] = {
    (7, 0): "volta",
    (7, 5): "turing",
    (8, 0): "ampere",
    (8, 6): "ampere",
    (8, 7): "ampere",
    (8, 9): "ada-lovelace",
    (9, 0): "hopper",
    (10, 0): "blackwell",
    (12, 0): "blackwell",
}

_INVALID = re.compile(r"[^A-Za-z0-9._-]+")


def gpu_family(compute_capability: tuple[int, int]) -> str | None:
    """GFD's family name of a compute capability (``(9, 0)`` -> ``hopper``), or ``None``."""
    major, minor = compute_capability
    return _FAMILIES.get((major, minor)) or _FAMILIES.get((major, 0))


def label_value(text: str) -> str:
    """``text`` as a valid label value: other characters become ``-``, at most 63, alnum ends.

    The one sanitiser for every label value nodeagent writes (Kubernetes allows at most 63
    characters of ``[A-Za-z0-9._-]``, beginning and ending with an alphanumeric).
    """
    value = _INVALID.sub("-", text.strip())[:63]
    return value.strip("-_.")


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the agent knows beyond the snapshot."""

    pool: str
    gpu_health: str | None = None  # worst device HealthState value; None before health runs
    stability: str | None = None  # stable | degraded | unstable; None before health runs
    mig_strategy: str = "single"  # the device plugin's MIG strategy (GFD: none|single|mixed)


def largest_nvlink_set(snapshot: NodeSnapshot) -> int:
    """Size of the largest set of GPUs connected to each other through NVLink (paths allowed)."""
    indices = [gpu.info.index for gpu in snapshot.gpus]
    return max(nvlink_components(indices, snapshot.topology), default=0)


def capability_labels(snapshot: NodeSnapshot, facts: NodeFacts) -> dict[str, str]:
    """The labels this node should carry. GPU facts come from the first GPU, as GFD does."""
    labels: dict[str, str] = {POOL: label_value(facts.pool), GPU_COUNT: str(len(snapshot.gpus))}
    if facts.gpu_health is not None:
        labels[GPU_HEALTH] = label_value(facts.gpu_health)
    if facts.stability is not None:
        labels[STABILITY] = label_value(facts.stability)
    driver = snapshot.driver_version.split(".")
    if driver and driver[0]:
        labels[DRIVER_VERSION] = label_value(snapshot.driver_version)
        keys = (CUDA_DRIVER_MAJOR, CUDA_DRIVER_MINOR, CUDA_DRIVER_REV)
        for key, part in zip(keys, driver[:3], strict=False):
            labels[key] = label_value(part)
    cuda = snapshot.cuda_driver_version.split(".")
    if cuda and cuda[0]:
        labels[CUDA_RUNTIME_MAJOR] = label_value(cuda[0])
        labels[CUDA_RUNTIME_MINOR] = label_value(cuda[1] if len(cuda) > 1 else "0")
    if not snapshot.gpus:
        return labels
    first = snapshot.gpus[0].info
    major, minor = first.compute_capability
    mig_capable = any(g.info.mig_capable for g in snapshot.gpus)
    labels.update(
        {
            GPU_PRODUCT: label_value(first.name),
            GPU_MEMORY: str(first.memory_total_bytes // (1024 * 1024)),
            GPU_COMPUTE_MAJOR: str(major),
            GPU_COMPUTE_MINOR: str(minor),
            MIG_CAPABLE: "true" if mig_capable else "false",
            NVLINK_LARGEST_SET: str(largest_nvlink_set(snapshot)),
        }
    )
    family = gpu_family((major, minor))
    if family:
        labels[GPU_FAMILY] = family
    # GFD publishes mig.strategy only on MIG-capable nodes.
    if mig_capable:
        labels[MIG_STRATEGY] = label_value(facts.mig_strategy)
    return labels


def label_patch(
    current: Mapping[str, str],
    desired: Mapping[str, str],
    managed: Iterable[str] = AGENT_LABELS,
) -> dict[str, str | None]:
    """The JSON merge-patch ``metadata.labels`` body that turns ``current`` into ``desired``.

    Only ``managed`` keys are removed: a stale one maps to ``None`` (delete), labels of other
    owners are left alone (pass a narrower ``managed`` when another component, such as the
    health reporter, owns some of these keys). Empty when nothing changed, so the agent skips
    the API call.
    """
    patch: dict[str, str | None] = {
        key: value for key, value in desired.items() if current.get(key) != value
    }
    for key in managed:
        if key in current and key not in desired:
            patch[key] = None
    return patch


def labels_changed(
    current: Mapping[str, str], desired: Mapping[str, str], managed: Iterable[str] = AGENT_LABELS
) -> bool:
    """Whether the node's agent-owned labels differ from ``desired``."""
    return bool(label_patch(current, desired, managed))
