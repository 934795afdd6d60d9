"""The ``kubernetes`` section: how the agent reaches the API server."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from nodeagent.config.loader import Schema


class KubernetesSection(Schema):
    """API server access for node conditions, labels and taints."""

    ordered = (("retry_initial_s", "retry_max_s"),)

    enabled: bool = Field(
        False, description="outside Kubernetes the same facts go to the state file and metrics"
    )
    kubeconfig: Path | None = Field(None, description="None: in-cluster service account")
    api_server: str | None = Field(
        None, min_length=1, description="override the API server URL (tests, proxies)"
    )
    request_timeout_s: float = Field(5.0, ge=0.1, le=300, description="per API request, seconds")
    retry_initial_s: float = Field(
        0.5, ge=0.01, le=60, description="first retry delay while the API server is unreachable"
    )
    retry_max_s: float = Field(
        30.0, ge=0.01, le=3600, description="retry delays double up to this, seconds"
    )
