"""Every name nodeagent puts on a Kubernetes object, and the one label-value sanitiser.

CONTRACT FILE: the agent writes these labels, annotations, the condition and the taints, and the
tiering service reads them; both sides take the names from here, so they cannot drift apart.

The capability labels are NVIDIA GPU feature discovery's (GFD) label set, names and values as
GFD writes them, so nodeSelectors, Kueue ResourceFlavors and schedulers written for GFD keep
working; facts GFD does not publish live under ``nodeagent.io/``. The reference is GFD as shipped
in NVIDIA's k8s-device-plugin v0.17 (``internal/lm``: the resource, MIG-strategy, version, mode
and machine-type labelers); docs/labels.md maps each label to its source and lists where
nodeagent departs from GFD, and why.

The capability labels are a pure function of a :class:`NodeSnapshot` plus the pool, health,
sharing and host facts the agent already holds; :func:`label_patch` tells the agent whether
anything changed, so it patches only on change.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from nodeagent.capacity import nvlink_components
from nodeagent.config.pool_policy import Sharing, SharingMode
from nodeagent.gpu.types import GpuInstance, GpuState, MigProfile, NodeSnapshot

# GPU feature discovery names (kept as GFD spells them).
GFD_PREFIX = "nvidia.com/"
GPU_RESOURCE = GFD_PREFIX + "gpu"  # the resource whose facts the gpu.* labels describe
GPU_PRODUCT = "nvidia.com/gpu.product"  # product name, spaces as dashes (+ -MIG-<p>, -SHARED)
GPU_MEMORY = "nvidia.com/gpu.memory"  # MiB per GPU (per MIG device under the single strategy)
GPU_COUNT = "nvidia.com/gpu.count"  # GPUs of that product (MIG devices under single)
GPU_REPLICAS = "nvidia.com/gpu.replicas"  # replicas per device; 0 on MIG-enabled GPUs
GPU_SHARING_STRATEGY = "nvidia.com/gpu.sharing-strategy"  # none | time-slicing | mps
GPU_FAMILY = "nvidia.com/gpu.family"  # architecture: ampere, hopper...
GPU_COMPUTE_MAJOR = "nvidia.com/gpu.compute.major"
GPU_COMPUTE_MINOR = "nvidia.com/gpu.compute.minor"
GPU_MACHINE = "nvidia.com/gpu.machine"  # DMI product name, spaces as dashes; unknown
GPU_MODE = "nvidia.com/gpu.mode"  # compute | graphics | unknown (the PCI class)
MIG_CAPABLE = "nvidia.com/mig.capable"  # "true" / "false"
MIG_STRATEGY = "nvidia.com/mig.strategy"  # single | mixed (absent under none, as GFD)
MPS_CAPABLE = "nvidia.com/mps.capable"  # "true" where a GPU is shared through MPS
# mig-manager's protocol (the GPU Operator): the operator names the node's layout, the agent
# reports pending, then success or failed (nodeagent.agent.mig_label).
MIG_CONFIG = "nvidia.com/mig.config"
MIG_CONFIG_STATE = "nvidia.com/mig.config.state"
CUDA_DRIVER_MAJOR = "nvidia.com/cuda.driver.major"  # GFD: the driver version, split
CUDA_DRIVER_MINOR = "nvidia.com/cuda.driver.minor"
CUDA_DRIVER_REV = "nvidia.com/cuda.driver.rev"
CUDA_RUNTIME_MAJOR = "nvidia.com/cuda.runtime.major"  # GFD: the CUDA version the driver offers
CUDA_RUNTIME_MINOR = "nvidia.com/cuda.runtime.minor"
# The names GFD added beside the ones above (which it keeps, marked deprecated).
CUDA_DRIVER_VERSION_MAJOR = "nvidia.com/cuda.driver-version.major"
CUDA_DRIVER_VERSION_MINOR = "nvidia.com/cuda.driver-version.minor"
CUDA_DRIVER_VERSION_REVISION = "nvidia.com/cuda.driver-version.revision"
CUDA_DRIVER_VERSION_FULL = "nvidia.com/cuda.driver-version.full"
CUDA_RUNTIME_VERSION_MAJOR = "nvidia.com/cuda.runtime-version.major"
CUDA_RUNTIME_VERSION_MINOR = "nvidia.com/cuda.runtime-version.minor"
CUDA_RUNTIME_VERSION_FULL = "nvidia.com/cuda.runtime-version.full"

# Per resource (``nvidia.com/gpu`` under the single strategy, ``nvidia.com/mig-<profile>`` under
# mixed): ``<resource>.<suffix>``. Base suffixes every resource carries, then a MIG device's.
RESOURCE_BASE_SUFFIXES = ("product", "count", "replicas", "sharing-strategy")
MIG_ATTRIBUTE_SUFFIXES = (
    "memory",
    "multiprocessors",
    "slices.gi",
    "slices.ci",
    "engines.copy",
    "engines.decoder",
    "engines.encoder",
    "engines.jpeg",
    "engines.ofa",
)
# The mixed strategy's per-profile keys, e.g. nvidia.com/mig-1g.10gb.count.
MIG_TYPE_LABEL = re.compile(
    r"^nvidia\.com/mig-[0-9]+g\.[0-9]+gb(\.[a-z0-9]+)*\.("
    + "|".join(re.escape(s) for s in (*RESOURCE_BASE_SUFFIXES, *MIG_ATTRIBUTE_SUFFIXES))
    + ")$"
)
# Under the single strategy nvidia.com/gpu carries the MIG device's attributes too.
GPU_MIG_ATTRIBUTE_LABELS = tuple(
    f"{GPU_RESOURCE}.{s}" for s in MIG_ATTRIBUTE_SUFFIXES if s != "memory"
)

MACHINE_UNKNOWN = "unknown"  # GFD's value when the machine type file cannot be read
PCI_CLASS_GRAPHICS = "0x030000"  # VGA controller: display mode on
PCI_CLASS_COMPUTE = "0x030200"  # 3D controller: the datacenter default

PREFIX = "nodeagent.io/"

# nodeagent's own labels.
POOL = PREFIX + "pool"
GPU_HEALTH = PREFIX + "gpu-health"  # worst device state: healthy|degraded|unhealthy|lost
STABILITY = PREFIX + "stability"  # stable | degraded | unstable
NVLINK_LARGEST_SET = PREFIX + "nvlink-largest-set"  # GPUs in the largest NVLink island
DRIVER_VERSION = PREFIX + "driver-version"  # full driver version, e.g. 550.54.15
MIG_LAYOUT = PREFIX + "mig-layout"  # the pool's MIG layout, once the agent applied it
TIER = PREFIX + "tier"  # written by the tiering service, never by the agent
# A node the tiering service keeps for a tier's large jobs (quota policy ``reserve``): this
# label (value RESERVED_VALUE) and a NoSchedule taint of the same key and value, which only pods
# Kueue admits to the reserved flavor tolerate.
RESERVED = PREFIX + "reserved"
RESERVED_VALUE = "large-jobs"

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
    GPU_REPLICAS,
    GPU_SHARING_STRATEGY,
    GPU_FAMILY,
    GPU_COMPUTE_MAJOR,
    GPU_COMPUTE_MINOR,
    GPU_MACHINE,
    GPU_MODE,
    *GPU_MIG_ATTRIBUTE_LABELS,
    MIG_CAPABLE,
    MIG_STRATEGY,
    MPS_CAPABLE,
    CUDA_DRIVER_MAJOR,
    CUDA_DRIVER_MINOR,
    CUDA_DRIVER_REV,
    CUDA_RUNTIME_MAJOR,
    CUDA_RUNTIME_MINOR,
    CUDA_DRIVER_VERSION_MAJOR,
    CUDA_DRIVER_VERSION_MINOR,
    CUDA_DRIVER_VERSION_REVISION,
    CUDA_DRIVER_VERSION_FULL,
    CUDA_RUNTIME_VERSION_MAJOR,
    CUDA_RUNTIME_VERSION_MINOR,
    CUDA_RUNTIME_VERSION_FULL,
    POOL,
    GPU_HEALTH,
    STABILITY,
    NVLINK_LARGEST_SET,
    DRIVER_VERSION,
    MIG_LAYOUT,
)


def is_agent_label(key: str, managed: Iterable[str] = AGENT_LABELS) -> bool:
    """Whether the agent owns ``key``: one of ``managed``, or a mixed-strategy MIG label."""
    return key in set(managed) or bool(MIG_TYPE_LABEL.match(key))


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


def gfd_name(text: str) -> str:
    """A name as GFD puts it in a label: other characters dropped, blanks as one ``-``.

    ``NVIDIA H100 80GB HBM3`` -> ``NVIDIA-H100-80GB-HBM3`` (GFD's ``sanitise``).
    """
    return "-".join(re.sub(r"[^A-Za-z0-9._ -]", "", text).split())


def gpu_mode(pci_class: str | None) -> str:
    """GFD's ``gpu.mode`` of a PCI class (sysfs ``class``, e.g. ``0x030200``)."""
    if pci_class == PCI_CLASS_COMPUTE:
        return "compute"
    if pci_class == PCI_CLASS_GRAPHICS:
        return "graphics"
    return "unknown"


def mig_device_name(profile: str) -> str:
    """A MIG device's name as GFD and the device plugin spell it: ``+`` becomes ``.``."""
    return profile.replace("+", ".")


_EXCLUSIVE = Sharing()
SharingLookup = Callable[[GpuState, int, str], Sharing]
"""How one GPU's devices of a resource are shared: (GPU, its rank by index, resource name)."""


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the agent knows beyond the snapshot."""

    pool: str
    gpu_health: str | None = None  # worst device HealthState value; None before health runs
    stability: str | None = None  # stable | degraded | unstable; None before health runs
    mig_strategy: str = "none"  # the device plugin's MIG strategy (GFD: none|single|mixed)
    # The machine type file's text (GFD: /sys/class/dmi/id/product_name); None: unreadable.
    machine: str | None = None
    # GPU index -> the PCI class sysfs reports for it (0x030200...); a missing GPU: unknown.
    pci_classes: Mapping[int, str] = field(default_factory=dict)
    # The device plugin's per-GPU sharing; None: every device exclusive.
    sharing: SharingLookup | None = None

    def sharing_of(self, gpu: GpuState, position: int, resource: str) -> Sharing:
        """The sharing of ``gpu``'s devices of ``resource`` (exclusive without a lookup)."""
        return self.sharing(gpu, position, resource) if self.sharing is not None else _EXCLUSIVE


def largest_nvlink_set(snapshot: NodeSnapshot) -> int:
    """Size of the largest set of GPUs connected to each other through NVLink (paths allowed)."""
    indices = [gpu.info.index for gpu in snapshot.gpus]
    return max(nvlink_components(indices, snapshot.topology), default=0)


@dataclass(frozen=True, slots=True)
class _MigDevice:
    """One MIG device the node serves: a GPU instance under one compute instance spanning it."""

    gpu: GpuState
    position: int
    name: str  # GFD's name: 1g.10gb, 1g.10gb.me
    profile: MigProfile | None  # None: the GPU's geometry is not known (attributes left out)


def _mig_devices(gpus: list[GpuState]) -> list[_MigDevice]:
    """The MIG devices on MIG-enabled GPUs, GPU by GPU, in instance order.

    Only instances held by one compute instance of the whole instance count, as the device
    plugin advertises only those (docs/labels.md: GFD counts every compute instance).
    """
    out: list[_MigDevice] = []
    for position, gpu in enumerate(gpus):
        if not gpu.info.mig_enabled:
            continue
        for instance in gpu.mig_instances:
            if not _whole_compute_instance(instance):
                continue
            geometry = gpu.mig_geometry
            profile = geometry.profile(instance.profile) if geometry is not None else None
            out.append(_MigDevice(gpu, position, mig_device_name(instance.profile), profile))
    return out


def _whole_compute_instance(instance: GpuInstance) -> bool:
    match = re.match(r"(\d+)g\.", instance.profile)
    if match is None or len(instance.compute_instances) != 1:
        return False
    return instance.compute_instances[0].slice_count == int(match.group(1))


def _replicas(sharing: Sharing | None) -> int:
    """GFD's ``replicas``: 0 where sharing does not apply (a MIG-enabled GPU), else 1 or N."""
    if sharing is None:
        return 0
    return sharing.replicas if sharing.mode is not SharingMode.EXCLUSIVE else 1


def _base_labels(
    resource: str, count: int, parts: tuple[str, ...], sharing: Sharing | None
) -> dict[str, str]:
    """GFD's product, count, replicas and sharing-strategy of one resource.

    ``sharing`` None: the resource is not shared by construction (MIG-enabled whole GPUs).
    A replicated resource's product ends in ``-SHARED`` unless it is renamed to ``.shared``.
    """
    replicas = _replicas(sharing)
    shared = sharing is not None and replicas > 1
    product = "-".join(gfd_name(p) for p in parts if p)
    if shared and sharing is not None and not sharing.rename_shared:
        product += "-SHARED"
    strategy = str(sharing.mode) if shared and sharing is not None else "none"
    return {
        f"{resource}.product": label_value(product),
        f"{resource}.count": str(count),
        f"{resource}.replicas": str(replicas),
        f"{resource}.sharing-strategy": strategy,
    }


def _full_gpu_labels(gpus: list[GpuState], facts: NodeFacts) -> dict[str, str]:
    """GFD's ``nvidia.com/gpu.*`` of whole GPUs: the product of the lowest-index GPU.

    GFD labels one product per node: with several, it warns and the labels name one of them
    (which one is the order of a Go map); nodeagent names the lowest-index GPU's product,
    counting the GPUs of that product. Sharing is that of the product's first GPU without MIG;
    when all of them have MIG enabled, the labels say replicas 0 and no sharing, as GFD.
    """
    first = gpus[0].info
    same = [(p, g) for p, g in enumerate(gpus) if g.info.name == first.name]
    whole = [(p, g) for p, g in same if not g.info.mig_enabled]
    sharing: Sharing | None = None
    if whole:
        position, gpu = whole[0]
        sharing = facts.sharing_of(gpu, position, GPU_RESOURCE)
    labels = _base_labels(GPU_RESOURCE, len(same), (first.name,), sharing)
    memory_mib = first.memory_total_bytes // (1024 * 1024)
    if memory_mib:
        labels[GPU_MEMORY] = str(memory_mib)
    major, minor = first.compute_capability
    if major:
        labels[GPU_FAMILY] = gpu_family((major, minor)) or "undefined"
        labels[GPU_COMPUTE_MAJOR] = str(major)
        labels[GPU_COMPUTE_MINOR] = str(minor)
    return labels


def _mig_resource_labels(
    resource: str, devices: list[_MigDevice], facts: NodeFacts
) -> dict[str, str]:
    """The labels of one MIG resource: its first device's product, profile and attributes."""
    first = devices[0]
    sharing = facts.sharing_of(first.gpu, first.position, resource)
    if sharing.mode is SharingMode.MPS:
        # The device plugin serves MIG devices exclusive under MPS (MPS does not run on MIG).
        sharing = _EXCLUSIVE
    parts = (first.gpu.info.name, "MIG", first.name)
    labels = _base_labels(resource, len(devices), parts, sharing)
    profile = first.profile
    if profile is not None:
        attributes = {
            "memory": profile.memory_bytes // (1024 * 1024),
            "multiprocessors": profile.multiprocessors,
            "slices.gi": profile.compute_slices,
            "slices.ci": profile.compute_slices,  # one compute instance spans the instance
            "engines.copy": profile.copy_engines,
            "engines.decoder": profile.decoders,
            "engines.encoder": 0,  # no MIG profile of the modelled parts has an encoder
            "engines.jpeg": profile.jpeg_decoders,
            "engines.ofa": profile.ofa,
        }
        labels.update({f"{resource}.{k}": str(v) for k, v in attributes.items()})
    return labels


def _invalid_single_labels(gpus: list[GpuState]) -> dict[str, str]:
    """GFD's labels for a node the single strategy cannot describe: ``<product>-MIG-INVALID``."""
    model = next(g.info.name for g in gpus if g.info.mig_enabled)
    return {
        GPU_PRODUCT: label_value(f"{gfd_name(model)}-MIG-INVALID"),
        GPU_COUNT: "0",
        GPU_REPLICAS: "0",
        GPU_MEMORY: "0",
    }


def _single_labels(gpus: list[GpuState], facts: NodeFacts) -> dict[str, str]:
    """The single strategy's overrides of ``nvidia.com/gpu.*`` (GFD's rules, in its order).

    No GPU in MIG mode: nothing (the whole-GPU labels stand). A MIG-enabled GPU without MIG
    devices, MIG-enabled next to MIG-disabled GPUs, or more than one MIG profile: INVALID.
    """
    if not any(g.info.mig_enabled for g in gpus):
        return {}
    devices = _mig_devices(gpus)
    served = {d.gpu.info.index for d in devices}
    empty = any(g.info.mig_enabled and g.info.index not in served for g in gpus)
    if empty or not all(g.info.mig_enabled for g in gpus) or len({d.name for d in devices}) != 1:
        return _invalid_single_labels(gpus)
    return _mig_resource_labels(GPU_RESOURCE, devices, facts)


def _mixed_labels(gpus: list[GpuState], facts: NodeFacts) -> dict[str, str]:
    """The mixed strategy's ``nvidia.com/mig-<profile>.*`` labels, one set per profile."""
    by_name: dict[str, list[_MigDevice]] = {}
    for device in _mig_devices(gpus):
        by_name.setdefault(device.name, []).append(device)
    labels: dict[str, str] = {}
    for name, devices in sorted(by_name.items()):
        labels.update(_mig_resource_labels(f"{GFD_PREFIX}mig-{name}", devices, facts))
    return labels


def _version_labels(snapshot: NodeSnapshot) -> dict[str, str]:
    """GFD's driver and CUDA version labels, under the old names and the new ones."""
    labels: dict[str, str] = {}
    driver = snapshot.driver_version.split(".")
    if len(driver) >= 2 and driver[0]:
        major, minor = label_value(driver[0]), label_value(driver[1])
        revision = label_value(driver[2]) if len(driver) > 2 else ""
        labels.update(
            {
                CUDA_DRIVER_MAJOR: major,
                CUDA_DRIVER_MINOR: minor,
                CUDA_DRIVER_REV: revision,
                CUDA_DRIVER_VERSION_MAJOR: major,
                CUDA_DRIVER_VERSION_MINOR: minor,
                CUDA_DRIVER_VERSION_REVISION: revision,
                CUDA_DRIVER_VERSION_FULL: label_value(snapshot.driver_version),
            }
        )
    cuda = snapshot.cuda_driver_version.split(".")
    if cuda and cuda[0]:
        major = label_value(cuda[0])
        minor = label_value(cuda[1]) if len(cuda) > 1 else "0"
        labels.update(
            {
                CUDA_RUNTIME_MAJOR: major,
                CUDA_RUNTIME_MINOR: minor,
                CUDA_RUNTIME_VERSION_MAJOR: major,
                CUDA_RUNTIME_VERSION_MINOR: minor,
                CUDA_RUNTIME_VERSION_FULL: f"{major}.{minor}",
            }
        )
    return labels


def gfd_labels(snapshot: NodeSnapshot, facts: NodeFacts) -> dict[str, str]:
    """GFD's label set of this node, computed from all its GPUs (none without GPUs, as GFD)."""
    gpus = sorted(snapshot.gpus, key=lambda g: g.info.index)
    if not gpus:
        return {}
    machine = (facts.machine or "").strip() or MACHINE_UNKNOWN
    mps = any(
        facts.sharing_of(g, p, GPU_RESOURCE).mode is SharingMode.MPS
        for p, g in enumerate(gpus)
        if not g.info.mig_enabled or facts.mig_strategy == "none"
    )
    labels = {
        GPU_MACHINE: label_value(machine.replace(" ", "-")) or MACHINE_UNKNOWN,
        # GFD keeps the first GPU's class (its loop stops at the first that differs).
        GPU_MODE: gpu_mode(facts.pci_classes.get(gpus[0].info.index)),
        MIG_CAPABLE: "true" if any(g.info.mig_capable for g in gpus) else "false",
        MPS_CAPABLE: "true" if mps else "false",
        **_version_labels(snapshot),
        **_full_gpu_labels(gpus, facts),
    }
    if facts.mig_strategy == "single":
        labels[MIG_STRATEGY] = "single"
        labels.update(_single_labels(gpus, facts))
    elif facts.mig_strategy == "mixed":
        labels[MIG_STRATEGY] = "mixed"
        labels.update(_mixed_labels(gpus, facts))
    return labels


def capability_labels(snapshot: NodeSnapshot, facts: NodeFacts) -> dict[str, str]:
    """The labels this node should carry: GFD's set and nodeagent's own."""
    labels = gfd_labels(snapshot, facts)
    labels[POOL] = label_value(facts.pool)
    if facts.gpu_health is not None:
        labels[GPU_HEALTH] = label_value(facts.gpu_health)
    if facts.stability is not None:
        labels[STABILITY] = label_value(facts.stability)
    if snapshot.driver_version.split(".")[0]:
        labels[DRIVER_VERSION] = label_value(snapshot.driver_version)
    if snapshot.gpus:
        labels[NVLINK_LARGEST_SET] = str(largest_nvlink_set(snapshot))
    return labels


def label_patch(
    current: Mapping[str, str],
    desired: Mapping[str, str],
    managed: Iterable[str] = AGENT_LABELS,
) -> dict[str, str | None]:
    """The JSON merge-patch ``metadata.labels`` body that turns ``current`` into ``desired``.

    Only ``managed`` keys and the mixed strategy's ``nvidia.com/mig-<profile>.*`` keys (they
    come and go with the MIG layout) are removed: a stale one maps to ``None`` (delete), labels
    of other owners are left alone (pass a narrower ``managed`` when another component, such as
    the health reporter, owns some of these keys). Empty when nothing changed, so the agent skips
    the API call.
    """
    patch: dict[str, str | None] = {
        key: value for key, value in desired.items() if current.get(key) != value
    }
    owned = set(managed)
    for key in current:
        if key not in desired and is_agent_label(key, owned):
            patch[key] = None
    return patch


def labels_changed(
    current: Mapping[str, str], desired: Mapping[str, str], managed: Iterable[str] = AGENT_LABELS
) -> bool:
    """Whether the node's agent-owned labels differ from ``desired``."""
    return bool(label_patch(current, desired, managed))
