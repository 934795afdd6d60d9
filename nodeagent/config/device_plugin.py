"""The ``device_plugin`` section: the kubelet device plugin servers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class DevicePluginSection:
    """How GPUs are advertised to the kubelet."""

    enabled: bool = True
    kubelet_dir: Path = Path("/var/lib/kubelet/device-plugins")  # --kubelet-dir overrides it
    mig_strategy: str = "none"  # none | single | mixed (NVIDIA's MIG strategies)
