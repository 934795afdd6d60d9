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
    request_timeout_s: float = 5.0  # per API request, seconds
    retry_initial_s: float = 0.5  # first retry delay while the API server is unreachable
    retry_max_s: float = 30.0  # retry delays double up to this, seconds

    def __post_init__(self) -> None:
        if self.request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s must be positive, got {self.request_timeout_s}")
        if not 0 < self.retry_initial_s <= self.retry_max_s:
            raise ValueError("need 0 < retry_initial_s <= retry_max_s")
