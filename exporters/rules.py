"""The PrometheusRule manifest, generated from the Prometheus rule files the project ships.

``deploy/prometheus/*.yaml`` are plain Prometheus rule files (promtool tests them); the
Prometheus Operator wants the same groups wrapped in a PrometheusRule object, which is
``deploy/kubernetes/base/prometheusrule.yaml``. ``make rules`` regenerates it; a test fails
when the shipped file differs from a fresh generation.

    python -m nodeagent_exporters.rules --write
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

RULES_DIR = Path("deploy/prometheus")  # relative to the repository root
PROMETHEUS_RULE = Path("deploy/kubernetes/base/prometheusrule.yaml")

HEADER = """\
# GENERATED from deploy/prometheus/*.yaml by `make rules`; edit the rule files there, not this
# file (a test compares them).
"""


def rule_groups(rules_dir: Path) -> list[dict[str, Any]]:
    """The rule groups of every Prometheus rule file in ``rules_dir``, by file name."""
    groups: list[dict[str, Any]] = []
    for path in sorted([*rules_dir.glob("*.yaml"), *rules_dir.glob("*.yml")]):
        with path.open() as fh:
            for doc in yaml.safe_load_all(fh):
                if isinstance(doc, dict) and isinstance(doc.get("groups"), list):
                    groups.extend(doc["groups"])
    return groups


class _BlockDumper(yaml.SafeDumper):
    """Writes multi-line strings (PromQL expressions) as ``|`` blocks, as people write them."""


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str_representer)


def prometheus_rule_text(rules_dir: Path) -> str:
    """The PrometheusRule manifest wrapping the rule groups of ``rules_dir``."""
    manifest = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "nodeagent",
            "namespace": "nodeagent",
            "labels": {"app.kubernetes.io/name": "nodeagent"},
        },
        "spec": {"groups": rule_groups(rules_dir)},
    }
    return HEADER + yaml.dump(manifest, Dumper=_BlockDumper, sort_keys=False, width=100)


def main() -> None:
    """Print the manifest, or write it over the shipped file with ``--write``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--root", type=Path, default=Path(), help="the repository root")
    parser.add_argument("--write", action="store_true", help=f"write {PROMETHEUS_RULE}")
    args = parser.parse_args()
    text = prometheus_rule_text(args.root / RULES_DIR)
    if args.write:
        (args.root / PROMETHEUS_RULE).write_text(text)
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
