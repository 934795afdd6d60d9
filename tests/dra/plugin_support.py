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

    def get(self, namespace: str, name: str) -> Mapping[str, Any]:
        try:
            return self.items[(namespace, name)]
        except KeyError:
            raise PrepareError(f"claim {namespace}/{name} not found") from None


def make_driver(
    node: GpuNode,
    root: Path,
    claims: Any,
    *,
    dynamic_mig: bool = True,
    lock_timeout_s: float = 5.0,
    mps: MpsSection | None = None,
) -> Driver:
    state = root / "state"
    return Driver(
        node,
        claims,
        Checkpoint.load(checkpoint_path(state)),
        CdiWriter(root / "cdi", f"k8s.{DRIVER}"),
        ProcessLock(root / "mig.lock", "the node's MIG layout"),
        driver_name=DRIVER,
        pool_name=NODE,
        dynamic_mig=dynamic_mig,
        state_dir=state,
        lock_timeout_s=lock_timeout_s,
        mps_section=mps,
    )


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
