"""A DRA plugin on a simulated node, served on real sockets, and claims shaped like the API's."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodeagent.cdi import CdiWriter
from nodeagent.config.device_plugin import MpsSection
from nodeagent.gpu.node import GpuNode
from nodeagent.runtime.lock import ProcessLock
from nodeagent_dra.checkpoint import Checkpoint, checkpoint_path
from nodeagent_dra.driver import Driver, PrepareError
from nodeagent_dra.plugin import PluginServer
from nodeagent_dra.slices import DraDevice, SliceSpec, build_slices

DRIVER = "gpu.nodeagent.io"
NODE = "node-a"


def claim_json(
    name: str,
    devices: Sequence[tuple[str, str]],
    *,
    namespace: str = "team-a",
    uid: str | None = None,
    config: Sequence[Mapping[str, Any]] = (),
    pool: str = NODE,
) -> dict[str, Any]:
    """A ResourceClaim as the API serves it once the scheduler allocated (request, device)s."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4())},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": r, "driver": DRIVER, "pool": pool, "device": d}
                        for r, d in devices
                    ],
                    "config": list(config),
                }
            }
        },
    }


@dataclass
class Claims:
    """Claims by (namespace, name), as the plugin reads them from the API server."""

    items: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)

    def add(self, claim: dict[str, Any]) -> tuple[str, str, str]:
        meta = claim["metadata"]
        self.items[(meta["namespace"], meta["name"])] = claim
        return meta["namespace"], meta["uid"], meta["name"]

    def get(self, namespace: str, name: str, timeout_s: float | None = None) -> Mapping[str, Any]:
        try:
            return self.items[(namespace, name)]
        except KeyError:
            raise PrepareError(f"claim {namespace}/{name} not found") from None


class Published:
    """What the node publishes, kept in memory as the agent's component keeps its last
    publication, so a call's latency is the driver's own. Built at the first prepare: the names
    do not change with what the driver makes (a dynamic placement keeps its name once made, and
    the driver never makes static instances); a test that changes the node's layout itself
    calls :meth:`build` again."""

    def __init__(self, node: GpuNode, dynamic_mig: bool) -> None:
        self.node = node
        self.dynamic_mig = dynamic_mig
        self.driver: Driver | None = None
        self.table: Mapping[str, DraDevice] | None = None

    def build(self) -> Mapping[str, DraDevice]:
        assert self.driver is not None
        spec = SliceSpec(NODE, DRIVER, dynamic_mig=self.dynamic_mig, managed=self.driver.managed())
        self.table = build_slices(self.node.snapshot(), spec).devices
        return self.table

    def __call__(self) -> Mapping[str, DraDevice]:
        return self.table if self.table is not None else self.build()


def make_driver(
    node: GpuNode,
    root: Path,
    claims: Any,
    *,
    dynamic_mig: bool = True,
    lock_timeout_s: float = 5.0,
    mps: MpsSection | None = None,
    state_dir: Path | None = None,
) -> Driver:
    state = root / "state" if state_dir is None else state_dir
    published = Published(node, dynamic_mig)
    driver = Driver(
        node,
        claims,
        Checkpoint.load(checkpoint_path(state)),
        CdiWriter(root / "cdi", f"k8s.{DRIVER}"),
        ProcessLock(root / "mig.lock", "the node's MIG layout"),
        driver_name=DRIVER,
        pool_name=NODE,
        dynamic_mig=dynamic_mig,
        state_dir=state,
        published=published,
        lock_timeout_s=lock_timeout_s,
        mps_section=mps,
    )
    published.driver = driver
    return driver


def serve(driver: Driver, root: Path, **kwargs: Any) -> PluginServer:
    server = PluginServer(
        driver,
        driver_name=DRIVER,
        registry_dir=root / "plugins_registry",
        plugin_dir=root / "plugins",
        **kwargs,
    )
    server.start()
    return server
