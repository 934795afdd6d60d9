"""Last in the folder: after the real kubelet created, removed and restarted containers and
guarded kernel settings, none of it reached the machine."""

from __future__ import annotations

from typing import Any

import pytest

from nodeagent.testing.kube.pytest_plugin import snapshot_host
from nodeagent.testing.kube.realnode import RealNode

pytestmark = pytest.mark.kubelet


def test_the_machine_is_untouched(real_node: RealNode, host_snapshot: dict[str, Any]) -> None:
    """Runs after the pods above were created and removed: the kubelet removed containers,
    restarted, and guarded kernel settings; none of it may reach the host."""
    now = snapshot_host()
    assert now["/bin"] == host_snapshot["/bin"], "kubelet: /bin changed"
    assert now["/proc/sys"] == host_snapshot["/proc/sys"], "kubelet: kernel settings changed"
    missing = set(host_snapshot["checkout"]) - set(now["checkout"])
    assert not missing, f"kubelet: removed from the checkout: {sorted(missing)}"
    assert now["/etc/kueue"] == host_snapshot["/etc/kueue"], "Kueue wrote into /etc/kueue"
    # The kubelet's working directory is where a container without a log path is "removed".
    assert real_node.canary.exists(), f"kubelet: deleted files in its cwd {real_node.scratch}"
