"""``python -m nodeagent.testing.kube``: run the control plane in the foreground (``make cluster``).

Prints the admin kubeconfig's path, then serves until Ctrl-C. ``--nodes N`` adds N kubelet-less
8-GPU nodes (with the kubelet stand-in running their pods), so ``kubectl`` and
``nodeagent tiering run --kubeconfig`` have something to look at. ``--identities`` applies the
deploy manifests' ServiceAccounts and RBAC and prints a kubeconfig for the agent's and the
tiering service's account, to run them with exactly the permissions a cluster gives them.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from nodeagent.testing.kube.controlplane import ControlPlane, ControlPlaneError
from nodeagent.testing.kube.deploy import install_identities
from nodeagent.testing.kube.nodes import KubeletStandIn, create_node


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make cluster", description=__doc__)
    parser.add_argument("--no-kueue", action="store_true", help="leave Kueue out")
    parser.add_argument("--nodes", type=int, default=0, help="kubelet-less 8-GPU nodes to add")
    parser.add_argument("--workdir", help="keep data, certificates and logs here")
    parser.add_argument(
        "--identities",
        action="store_true",
        help="apply the deploy manifests' RBAC; print the agent's and the service's kubeconfigs",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        # Building the plane finds its programs: one not built yet is a line, not a traceback.
        plane = ControlPlane(
            scheduler=True,
            controller_manager=True,
            kueue=not args.no_kueue,
            workdir=None if args.workdir is None else Path(args.workdir),
        )
        plane.start()
    except ControlPlaneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stand_in = KubeletStandIn(plane.api_client()).start()
    try:
        for i in range(args.nodes):
            create_node(plane.api_client(), f"gpu-node-{i}", gpus=8)
        if args.identities:
            identities = install_identities(plane)
            print(f"agent kubeconfig: {identities.agent.kubeconfig.path}")
            print(f"tiering kubeconfig: {identities.tiering.kubeconfig.path}")
        print(f"logs: {plane.logs_dir}")
        print(f"export KUBECONFIG={plane.admin.path}")
        print("serving; Ctrl-C stops every component", flush=True)
        while not stop.wait(1.0):
            plane.check()
    except ControlPlaneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        stand_in.stop()
        plane.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
