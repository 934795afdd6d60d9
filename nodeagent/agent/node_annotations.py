"""The GPU-state annotation this node publishes (``nodeagent.io/gpu-state``), computed when asked.

The tiering service reads it to tell why a GPU workload is pending and what would unblock it
(:mod:`nodeagent.published` is the codec). It is built from the latest snapshot, the health
model's device states and, when the exporter polls the kubelet's pod-resources API, which pod
holds which device.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from nodeagent import labels, published
from nodeagent.runtime.health_source import HealthSource
from nodeagent.runtime.snapshots import SnapshotFeed
from nodeagent_exporters.podresources import Allocations


def holders(allocations: Allocations | None) -> dict[str, str] | None:
    """Device UUID -> ``namespace/pod``; ``None`` while the kubelet has never answered."""
    if allocations is None or not allocations.known:
        return None
    return {d.uuid: f"{d.namespace}/{d.pod}" for d in allocations.pod_devices}


def pods_by_device(allocations: Allocations | None) -> dict[str, list[str]] | None:
    """Device UUID -> every ``namespace/pod`` holding it (several on a shared GPU)."""
    if allocations is None or not allocations.known:
        return None
    out: dict[str, list[str]] = {}
    for d in allocations.pod_devices:
        pod = f"{d.namespace}/{d.pod}"
        if pod not in out.setdefault(d.uuid, []):
            out[d.uuid].append(pod)
    return out


class GpuStateAnnotation:
    """Provider for the health reporter: ``{GPU_STATE_ANNOTATION: json}``, empty before a sample."""

    def __init__(
        self,
        snapshots: SnapshotFeed,
        health: HealthSource | None = None,
        allocations: Callable[[], Allocations | None] | None = None,
        shared: Callable[[], Mapping[str, tuple[float, int]] | None] | None = None,
    ) -> None:
        self._snapshots = snapshots
        self._shared = shared
        self._health = health
        self._allocations = allocations

    def __call__(self) -> Mapping[str, str]:
        """The annotation now."""
        snapshot = self._snapshots.latest
        if snapshot is None:
            return {}
        states = {}
        if self._health is not None:
            states = {uuid: d.state.value for uuid, d in self._health.device_health().items()}
        allocations = self._allocations() if self._allocations is not None else None
        node = published.publish(
            snapshot,
            states,
            holders(allocations),
            pods_by_device(allocations),
            self._shared() if self._shared is not None else None,
        )
        return {labels.GPU_STATE_ANNOTATION: published.encode(node)}
