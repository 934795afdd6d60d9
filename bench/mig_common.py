"""Shared helpers for the MIG benchmarks: geometries from the simulator's models."""

from __future__ import annotations

import tempfile
from pathlib import Path

from nodeagent.agent.backend import open_node
from nodeagent.gpu.types import MigGeometry

# One preset per MIG model; the churn bench builds 8-GPU nodes of each geometry.
MODEL_PRESETS = {
    "A100-40GB": "dgx-a100",
    "A100-80GB": "dgx-a100-80",
    "H100-80GB": "dgx-h100",
    "H100-NVL": "pcie-h100nvl",
    "H200-141GB": "hgx-h200",
    "A30-24GB": "a30x4",
}


def geometries() -> dict[str, MigGeometry]:
    """The MIG geometry of each model, read through the GPU layer from the simulator."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, preset in MODEL_PRESETS.items():
            node = open_node(simulate=preset, state_dir=Path(tmp) / preset)
            geometry = node.mig_geometry(0)
            node.close()
            assert geometry is not None, preset
            out[label] = geometry
    return out
