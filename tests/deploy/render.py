"""Render the kustomize tree in Python, and generate the PrometheusRule from the rule files.

The renderer covers exactly the kustomize features deploy/kubernetes uses: ``resources`` (files
and directories holding a kustomization) and ``patches`` with a ``path`` holding a strategic
merge patch (lists of objects merged by their Kubernetes merge key, ``$patch: delete`` to drop
an entry, other lists replaced). Anything else in a kustomization is an error, so a new feature
can't slip in unrendered; where ``kubectl kustomize`` exists the tests compare the two.

Run as a script to regenerate ``deploy/kubernetes/base/prometheusrule.yaml`` from the
Prometheus rule files in ``deploy/prometheus/``::

    python tests/deploy/render.py --write-prometheusrule
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
KUSTOMIZE_DIR = REPO / "deploy" / "kubernetes"
RULES_DIR = REPO / "deploy" / "prometheus"
PROMETHEUS_RULE = KUSTOMIZE_DIR / "base" / "prometheusrule.yaml"

SUPPORTED_KEYS = {"apiVersion", "kind", "resources", "patches"}

# Kubernetes' patchMergeKey for the lists the manifests patch (from the API types).
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "tolerations": None,  # atomic: replaced
}


class RenderError(Exception):
    """The kustomization uses something this renderer does not support, or is broken."""


def load_documents(path: Path) -> list[dict[str, Any]]:
    """Every non-empty YAML document in a file."""
    with path.open() as fh:
        return [doc for doc in yaml.safe_load_all(fh) if doc]


def object_key(obj: dict[str, Any]) -> tuple[str, str, str]:
    """(kind, namespace, name): what identifies an object in a rendered set."""
    meta = obj.get("metadata") or {}
    return (obj["kind"], meta.get("namespace", ""), meta["name"])


def strategic_merge(base: Any, patch: Any, field: str = "") -> Any:
    """Apply a strategic merge patch to ``base`` (a copy is returned)."""
    if isinstance(patch, dict) and isinstance(base, dict):
        result = copy.deepcopy(base)
        for key, value in patch.items():
            if key == "$patch":
                continue
            if value is None:
                result.pop(key, None)
            elif key in result:
                result[key] = strategic_merge(result[key], value, key)
            else:
                result[key] = copy.deepcopy(value)
        return result
    if isinstance(patch, list) and isinstance(base, list):
        merge_key = MERGE_KEYS.get(field)
        if merge_key is None or not all(isinstance(item, dict) for item in patch):
            return copy.deepcopy(patch)
        result = copy.deepcopy(base)
        for item in patch:
            if merge_key not in item:
                raise RenderError(f"patch entry in {field!r} lacks its merge key {merge_key!r}")
            index = next(
                (i for i, old in enumerate(result) if old.get(merge_key) == item[merge_key]), None
            )
            if item.get("$patch") == "delete":
                if index is None:
                    raise RenderError(f"$patch: delete of a missing {field} entry {item}")
                del result[index]
            elif index is None:
                result.append(copy.deepcopy(item))
            else:
                result[index] = strategic_merge(result[index], item, field)
        return result
    return copy.deepcopy(patch)


def render(directory: Path) -> list[dict[str, Any]]:
    """The objects a kustomization directory renders to, in resource order."""
    kustomization = directory / "kustomization.yaml"
    if not kustomization.is_file():
        raise RenderError(f"{directory}: no kustomization.yaml")
    spec = yaml.safe_load(kustomization.read_text())
    unsupported = set(spec) - SUPPORTED_KEYS
    if unsupported:
        raise RenderError(f"{kustomization}: unsupported fields {sorted(unsupported)}")
    objects: list[dict[str, Any]] = []
    for entry in spec.get("resources", []):
        path = (directory / entry).resolve()
        if path.is_dir():
            objects.extend(render(path))
        elif path.is_file():
            objects.extend(load_documents(path))
        else:
            raise RenderError(f"{kustomization}: resource {entry!r} does not exist")
    seen: set[tuple[str, str, str]] = set()
    for obj in objects:
        key = object_key(obj)
        if key in seen:
            raise RenderError(f"{kustomization}: {key} defined twice")
        seen.add(key)
    for patch_entry in spec.get("patches", []):
        if set(patch_entry) != {"path"}:
            raise RenderError(f"{kustomization}: only `patches: - path:` is supported")
        for patch in load_documents(directory / patch_entry["path"]):
            key = object_key(patch)
            index = next((i for i, o in enumerate(objects) if object_key(o) == key), None)
            if index is None:
                raise RenderError(f"{kustomization}: patch target {key} not found")
            objects[index] = strategic_merge(objects[index], patch)
    return objects


def rule_groups() -> list[dict[str, Any]]:
    """The rule groups of every Prometheus rule file in deploy/prometheus, by file name."""
    groups: list[dict[str, Any]] = []
    if not RULES_DIR.is_dir():
        return groups
    for path in sorted([*RULES_DIR.glob("*.yaml"), *RULES_DIR.glob("*.yml")]):
        for doc in load_documents(path):
            if isinstance(doc, dict) and isinstance(doc.get("groups"), list):
                groups.extend(doc["groups"])
    return groups


class _BlockDumper(yaml.SafeDumper):
    """Writes multi-line strings (PromQL expressions) as ``|`` blocks, as people write them."""


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str_representer)


PROMETHEUS_RULE_HEADER = """\
# GENERATED from deploy/prometheus/*.yaml by `python tests/deploy/render.py
# --write-prometheusrule`; edit the rule files there, not this file (a test compares them).
"""


def prometheus_rule_text() -> str:
    """The PrometheusRule manifest wrapping the rule groups."""
    manifest = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "nodeagent",
            "namespace": "nodeagent",
            "labels": {"app.kubernetes.io/name": "nodeagent"},
        },
        "spec": {"groups": rule_groups()},
    }
    body = yaml.dump(manifest, Dumper=_BlockDumper, sort_keys=False, width=100)
    return PROMETHEUS_RULE_HEADER + body


def main(argv: list[str] | None = None) -> int:
    """Command line: regenerate the PrometheusRule, or print a rendered overlay."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-prometheusrule", action="store_true")
    parser.add_argument("--render", metavar="DIR", help="print the objects DIR renders to")
    args = parser.parse_args(argv)
    if args.write_prometheusrule:
        PROMETHEUS_RULE.write_text(prometheus_rule_text())
        print(f"wrote {PROMETHEUS_RULE.relative_to(REPO)} ({len(rule_groups())} groups)")
    if args.render:
        sys.stdout.write(yaml.safe_dump_all(render(Path(args.render)), sort_keys=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
