"""The MPS memory limit of a claim is read with the project's one Kubernetes quantity parser."""

from __future__ import annotations

from typing import Any

import pytest

from nodeagent_dra.sharing import SharingError, parse


def _mps(limit: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": limit}},
    }


@pytest.mark.parametrize(
    ("limit", "mib"),
    [
        ("10Gi", 10240),
        ("10G", 9536),  # decimal: 10e9 bytes is 9536.7 MiB, whole MiB only
        ("1.5Gi", 1536),
        ("512Mi", 512),
        ("1e9", 953),
        (2**30, 1024),
        ("100", 1),  # under a MiB still limits to the smallest the daemon takes
    ],
)
def test_memory_limits_in_kubernetes_quantity_grammar(limit: Any, mib: int) -> None:
    share = parse(_mps(limit))
    assert share is not None
    assert share.pinned_memory_limit_mib == mib


@pytest.mark.parametrize("limit", ["10K", "10 Gi", "lots", True, "-1Gi", "0", "1e400"])
def test_memory_limits_the_api_server_refuses_are_the_claims_error(limit: Any) -> None:
    with pytest.raises(SharingError, match="defaultPinnedDeviceMemoryLimit"):
        parse(_mps(limit))
