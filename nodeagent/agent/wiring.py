"""The one place where the agent's features are built and handed to each other, in order.

Each feature takes what it reads as a constructor argument, through a narrow interface from
:mod:`nodeagent.runtime` (a snapshot feed, a health source, the published devices) or a plain
callable; nothing is filled in after construction. The build order follows the data:

1. the sampler publishes snapshots into the store;
2. the MIG reconciler applies the pool's layout (the capability labels name it once applied),
   or the one the node's ``nvidia.com/mig.config`` label names (the GPU Operator's protocol,
   :mod:`nodeagent.agent.mig_label`, with Kubernetes), holding the device plugin's view meanwhile;
3. the health model, on its own, so the device plugin and the exporter can take it as their
   health source;
4. the device plugin, which publishes what it advertises, and the DRA driver (kubelet plugin
   and ResourceSlices; it takes the node-wide MIG lock the MIG reconciler takes);
5. the exporter, which reads health and the advertised devices, computes capacity and
   attributes GPU processes to pods (the XID attributor, built before it, reads that);
6. the health component around the model: its reporter publishes the capability labels, the
   exporter's capacity annotations and the GPU-state annotation on the node.

Components start in the order the supervisor lists them (sampler, MIG reconciler, MIG label,
health, device plugin, DRA driver, metrics, sharing actions). A feature turned off in the config
is absent from that list: each feature's builder makes the choice and builds a
:class:`~nodeagent.runtime.component.Idle` component for it (the MIG reconciler's, health's and
the exporter's null components keep their interface and report nothing, as an absent feature
did; the device plugin's says "no plugin" to the exporter and takes a sharing action's reload
as a no-op; the XID attributor and the validator have null objects too), left out here, in one
place.
The one ``None`` handed on is the health source, which the features define as "no health".

The modules beside this one are composition too, each joining features that may not import
each other: :mod:`~nodeagent.agent.node_labels` (snapshot, device plugin sharing, applied MIG
layout), :mod:`~nodeagent.agent.node_annotations` (snapshot, health, the exporter's pod-resources
poll) and :mod:`~nodeagent.agent.mig_planning` (the MIG planner handed to the tiering diagnosis).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from nodeagent.agent import mig_label
from nodeagent.agent.node_annotations import GpuStateAnnotation
from nodeagent.agent.node_labels import CapabilityLabels
from nodeagent.agent.sampler import Sampler
from nodeagent.config.schema import AgentConfig
from nodeagent.gpu.node import GpuNode
from nodeagent.health import component as health
from nodeagent.runtime.component import Component, Idle, Reloadable
from nodeagent.runtime.snapshots import SnapshotFeed, SnapshotStore
from nodeagent.sharing import component as sharing
from nodeagent_device_plugin import component as device_plugin
from nodeagent_dra import component as dra
from nodeagent_exporters import component as exporters
from nodeagent_mig import reconciler as mig


@dataclass(frozen=True, slots=True)
class Wired:
    """What the agent runs and what it tells about a new config."""

    components: tuple[Component, ...]  # in start order
    reloadables: tuple[Reloadable, ...]  # components and helpers that take a new config


def build(
    config: AgentConfig,
    node: GpuNode,
    snapshots: SnapshotStore,
    *,
    restarts: Mapping[str, int],
    ready: Callable[[], bool],
    alive: Callable[[], bool],
    mig_lock_file: Path | None = None,
    started_at_s: float | None = None,
    host_root: Path = Path("/"),
) -> Wired:
    """Build every enabled feature of ``config`` around ``node``.

    ``restarts`` (component restarts, exported as a metric), ``ready`` (every component ready),
    ``alive`` (threads up, sampling not wedged) and ``started_at_s`` (the process start) are
    the agent's own, read by the exporter; ``mig_lock_file`` is the node-wide MIG lock;
    ``host_root`` is where the host's own files are read (a simulated node's folder of them).
    """
    feed: SnapshotFeed = snapshots
    sampler = Sampler(node, snapshots, config.sampler)
    # One node-wide MIG lock: `nodeagent mig apply`, the reconciler and the DRA driver's
    # dynamic MIG all take it.
    mig_lock = mig_lock_file or config.state_dir / "mig" / "mig.lock"
    # With the API server at hand, the node's `nvidia.com/mig.config` label (the GPU Operator's
    # protocol) may choose the layout; the reconciler then waits for its first reading.
    label_protocol = config.kubernetes.enabled and config.mig.enabled
    reconciler = mig.build(config, node, lock_file=mig_lock, await_override=label_protocol)
    mig_config_label, plugin_feed = mig_label.build(config, reconciler, snapshots)
    labels = CapabilityLabels(feed, config, reconciler, host_root=host_root)
    # The health source: None is the features' own "no health" (no health service, no health
    # series, nothing withheld), which is not "healthy"; every other part is a null object.
    model = health.build_model(config)
    plugin = device_plugin.build(config, plugin_feed, model)
    dra_driver = dra.build(config, node, feed, model, mig_lock_file=mig_lock)
    # Application XIDs go to the pods of the exporter's last attribution (bound late: the
    # exporter is built next, and the attributor only reads it once events flow).
    xids = health.build_attributor(config, lambda: exporter.processes())
    validator = health.build_validator(config, model, node, feed)
    exporter = exporters.build(
        config,
        feed,
        health=model,
        devices=plugin,
        restarts=restarts,
        ready_check=ready,
        live_check=alive,
        mig_status=reconciler.status,
        started_at_s=started_at_s,
        app_xids=xids.counts,
        remediation_steps=validator.counts,
        validations=validator.passed,
    )
    gpu_state = GpuStateAnnotation(feed, model, exporter.allocations, exporter.shared_gpus)

    def annotations() -> Mapping[str, str]:
        return {**exporter.capacity_annotations(), **gpu_state()}

    health_component = health.build(
        config,
        model,
        node,
        feed,
        labels=labels,
        annotations=annotations,
        xids=xids,
        validator=validator,
    )
    actions = sharing.build(config, feed, plugin, measured=exporter.measured)
    components: tuple[Component, ...] = tuple(
        c
        for c in (
            sampler,
            reconciler,
            mig_config_label,
            health_component,
            plugin,
            dra_driver,
            exporter,
            actions,
        )
        if not isinstance(c, Idle)
    )
    reloadables = tuple(c for c in (*components, labels) if isinstance(c, Reloadable))
    return Wired(components, reloadables)
