"""The init container of the Helm chart's per-node configs: copy this node's chosen entry.

``python -m nodeagent.agent.config_select --dir DIR --out FILE [--default NAME]
[--fallback named,single]`` reads this node's ``nvidia.com/device-plugin.config`` label (a GET
of the node named by env ``NODE_NAME``, which the agent's ClusterRole already allows), chooses
the entry as :mod:`nodeagent.config.selection` says, and writes its text to FILE, where
``nodeagent run --config`` reads it. It runs before the agent, so the agent itself, its
SIGHUP reloads and ``nodeagent config`` commands see one plain config file.

The API server is reached as the agent reaches it (``NODEAGENT_KUBERNETES_*`` overrides, else
the pod's service account). Exit 0 with one line naming the entry and why; exit 1 when the
API server cannot be read (the kubelet retries the init container); exit 2 when no entry can
be chosen, with the reason.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from nodeagent.atomicfile import write_text_atomic
from nodeagent.config.kubernetes import KubernetesSection
from nodeagent.config.loader import env_overrides
from nodeagent.config.selection import (
    CONFIG_LABEL,
    SelectionError,
    choose,
    entries_in,
    parse_fallbacks,
)
from nodeagent.kube.node_label import read_node_label
from nodeagent.kube.node_patcher import KubeUnavailableError, make_api

EXIT_UNAVAILABLE = 1
EXIT_USAGE = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m nodeagent.agent.config_select",
        description="Copy the agent config entry this node's label chooses.",
    )
    parser.add_argument("--dir", type=Path, required=True, help="the entries (a ConfigMap)")
    parser.add_argument("--out", type=Path, required=True, help="where to write the entry")
    parser.add_argument("--default", default="", help="entry for nodes without the label")
    parser.add_argument("--fallback", default="named,single", help="named, single, or both")
    parser.add_argument("--label", default=CONFIG_LABEL, help="the node label naming the entry")
    parser.add_argument("--node", default=None, help="node name (default: env NODE_NAME)")
    return parser


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Run once; returns the exit code (see the module docstring)."""
    args = _parser().parse_args(argv)
    env = os.environ if environ is None else environ
    node = args.node or env.get("NODE_NAME")
    if not node:
        return _error("no node name: set NODE_NAME (the downward API's spec.nodeName)")
    try:
        fallbacks = parse_fallbacks(args.fallback)
        entries = entries_in(args.dir)
    except SelectionError as exc:
        return _error(str(exc))
    except OSError as exc:
        return _error(f"cannot read the config entries in {args.dir}: {exc}")
    section = KubernetesSection.model_validate(
        env_overrides(KubernetesSection, env, "NODEAGENT_KUBERNETES")[0]
    )
    try:
        api = make_api(section)
        label = read_node_label(api, node, args.label, timeout_s=section.request_timeout_s)
    except KubeUnavailableError as exc:
        sys.stderr.write(f"error: cannot read node {node}'s labels: {exc}\n")
        return EXIT_UNAVAILABLE
    try:
        choice = choose(entries, label, args.default, fallbacks, label_key=args.label)
    except SelectionError as exc:
        return _error(f"node {node}: {exc}")
    try:
        write_text_atomic(args.out, entries[choice.name].read_text())
    except OSError as exc:  # StateFileError included
        return _error(f"cannot write {args.out}: {exc}")
    sys.stdout.write(f"node {node}: agent config {choice.name!r} ({choice.reason})\n")
    return 0


def _error(message: str) -> int:
    sys.stderr.write(f"error: {message}\n")
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
