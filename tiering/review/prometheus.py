"""The pool review's Prometheus reads: instant values per node for the tier table, and GPU use
per node and namespace over the period for the quota section (the only HTTP the review does)."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PROM_QUERIES = {
    "fragmentation": "avg by ({node}) (nodeagent_mig_fragmentation_ratio)",
    "stranded_slices": "sum by ({node}) (nodeagent_stranded_mig_slices)",
    "stranded_gpus": "sum by ({node}) (nodeagent_stranded_gpus)",
}


class ReportError(Exception):
    """The review could not be built (e.g. Prometheus unreachable)."""


def instant_query(url: str, query: str, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """The result vector of one instant query against the Prometheus HTTP API."""
    if not url.startswith(("http://", "https://")):
        raise ReportError(f"--prometheus {url!r} is not an http(s) URL")
    full = f"{url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    try:
        with urllib.request.urlopen(full, timeout=timeout_s) as resp:  # noqa: S310
            body = json.loads(resp.read())
    except (OSError, ValueError) as exc:
        raise ReportError(f"cannot query Prometheus at {url}: {exc}") from exc
    if body.get("status") != "success":
        raise ReportError(f"Prometheus refused {query!r}: {body.get('error', 'unknown')}")
    result: list[dict[str, Any]] = (body.get("data") or {}).get("result") or []
    return result


def query_prometheus(
    url: str, node_label: str, timeout_s: float = 10.0
) -> dict[str, dict[str, float]]:
    """Per-node values of each query in :data:`PROM_QUERIES` from the Prometheus HTTP API."""
    out: dict[str, dict[str, float]] = {}
    for key, template in PROM_QUERIES.items():
        values: dict[str, float] = {}
        for sample in instant_query(url, template.format(node=node_label), timeout_s):
            node = (sample.get("metric") or {}).get(node_label)
            if node is not None:
                values[node] = float(sample["value"][1])
        out[key] = values
    return out


_HELD = 'group by ({node}, uuid, namespace) (nodeagent_device_plugin_pod_devices{{mig_profile=""}})'
PROM_USAGE = {
    "samples": "sum_over_time((count by ({node}, namespace) (" + _HELD + "))[{range}])",
    "utilisation": "sum_over_time((sum by ({node}, namespace) (nodeagent_gpu_utilization_ratio"
    " * on ({node}, uuid) group_right " + _HELD + "))[{range}])",
    "memory": "sum_over_time((sum by ({node}, namespace) (nodeagent_gpu_memory_used_bytes"
    " * on ({node}, uuid) group_right " + _HELD + "))[{range}])",
}


@dataclass(frozen=True)
class PromUsage:
    """Per ``(node, namespace)``, over the period: samples of GPUs held (one per GPU per
    step), and utilisation and memory summed over those samples."""

    step_s: float
    samples: Mapping[tuple[str, str], float]
    utilisation: Mapping[tuple[str, str], float]
    memory: Mapping[tuple[str, str], float]


def query_usage(
    url: str, node_label: str, *, period_s: float, step_s: float, timeout_s: float = 30.0
) -> PromUsage:
    """:class:`PromUsage` from subqueries over the period at ``step_s``.

    Raises:
        ReportError: Prometheus unreachable or the query refused.
    """
    step = max(1, int(step_s))
    window = f"{int(period_s)}s:{step}s"
    found: dict[str, dict[tuple[str, str], float]] = {}
    for key, template in PROM_USAGE.items():
        query = template.format(node=node_label, range=window)
        values: dict[tuple[str, str], float] = {}
        for sample in instant_query(url, query, timeout_s):
            metric = sample.get("metric") or {}
            node, namespace = metric.get(node_label), metric.get("namespace")
            if node is not None and namespace is not None:
                values[(str(node), str(namespace))] = float(sample["value"][1])
        found[key] = values
    return PromUsage(float(step), found["samples"], found["utilisation"], found["memory"])
