"""The ``kubernetes`` section: how the agent reaches the API server."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class KubernetesSection:
    """API server access for node conditions, labels and taints."""

    enabled: bool = False  # outside Kubernetes the same facts go to the state file and metrics
    kubeconfig: Path | None = None  # None: in-cluster service account
    api_server: str | None = None  # override the API server URL (tests, proxies)
