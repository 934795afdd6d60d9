"""Read one label of this node, and set labels on it, for the MIG config label protocol.

The agent's ClusterRole grants ``get`` and ``patch`` on nodes and nothing more (no list, no
watch: it would let every agent read every node), so the label is read with a GET of this
node. Each label is set with its own small merge patch, apart from the health reporter's
patches, so neither side ever removes a label the other owns.
"""

from __future__ import annotations

from typing import Any

from nodeagent.kube.node_patcher import api_errors

MERGE = "application/merge-patch+json"


def read_node_label(api: Any, node_name: str, key: str, *, timeout_s: float) -> str | None:
    """The value of label ``key`` on ``node_name`` (None when the node has no such label).

    Raises:
        KubeUnavailableError: the API server is unreachable or refused the read.
    """
    with api_errors(f"reading node {node_name}"):
        node = api.read_node(node_name, _request_timeout=timeout_s)
    found = (node.metadata.labels or {}).get(key) if node.metadata is not None else None
    return str(found) if found is not None else None


def set_node_labels(
    api: Any, node_name: str, values: dict[str, str | None], *, timeout_s: float
) -> None:
    """Set (a value) or remove (None) the labels ``values`` names on ``node_name``.

    Raises:
        KubeUnavailableError: the API server is unreachable or refused the patch.
    """
    with api_errors(f"for node {node_name}"):
        api.patch_node(
            node_name,
            {"metadata": {"labels": values}},
            _content_type=MERGE,
            _request_timeout=timeout_s,
        )
