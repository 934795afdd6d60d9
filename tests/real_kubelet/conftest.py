"""The real-kubelet node lives as long as this package's tests.

The plugin's node is the whole session's; here it is this package's, so its kubelet, its
agent and its Node object are gone before the tests of other packages list the cluster's nodes.
"""

from __future__ import annotations

import pytest

from nodeagent.testing.kube.pytest_plugin import real_node_fixture

_real_node_session = pytest.fixture(scope="package", name="_real_node_session")(real_node_fixture)
