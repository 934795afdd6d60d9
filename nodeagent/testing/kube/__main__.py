"""``python -m nodeagent.testing.kube``: run the control plane in the foreground (``make cluster``).

Prints the admin kubeconfig's path, then serves until Ctrl-C. ``--nodes N`` adds N kubelet-less
8-GPU nodes (with the kubelet stand-in running their pods), so ``kubectl`` and
``nodeagent tiering run --kubeconfig`` have something to look at. ``--kubelets N`` adds N nodes
run by a real kubelet (with Kubernetes' fake CRI runtime) and ``nodeagent run --simulate PRESET``
on each (:mod:`.realnode`; root is needed for the kubelet's mount namespace). ``--identities``
applies the deploy manifests' ServiceAccounts and RBAC and prints a kubeconfig for the agent's
and the tiering service's account, to run them with exactly the permissions a cluster gives them.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

try:
    from nodeagent.testing.kube.controlplane import ControlPlane, ControlPlaneError
    from nodeagent.testing.kube.deploy import install_identities
    from nodeagent.testing.kube.nodes import KubeletStandIn, create_node
    from nodeagent.testing.kube.realnode import RealNode, can_make_namespaces, node_bins_dir
except ModuleNotFoundError as missing:  # the harness's packages come with the 'testing' extra
    sys.stderr.write(
        f"make cluster: the test harness needs {missing.name!r}, which a plain install lacks; "
        "install it with: pip install 'nodeagent[testing]'\n"
    )
    sys.exit(2)

# The agent on a `make cluster` real-kubelet node: each MIG profile its own resource, so after
# `nodeagent mig apply` a pod can ask for nvidia.com/mig-3g.40gb (docs/kubelet.md).
REAL_NODE_AGENT_CONFIG = {"device_plugin": {"mig_strategy": "mixed"}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make cluster", description=__doc__)
    parser.add_argument("--no-kueue", action="store_true", help="leave Kueue out")
    parser.add_argument("--nodes", type=int, default=0, help="kubelet-less 8-GPU nodes to add")
    parser.add_argument(
        "--kubelets", type=int, default=0, help="nodes run by a real kubelet, with the agent"
    )
    parser.add_argument("--preset", default="dgx-h100", help="simulated GPUs of those nodes")
    parser.add_argument("--workdir", help="keep data, certificates and logs here")
    parser.add_argument(
        "--identities",
        action="store_true",
        help="apply the deploy manifests' RBAC; print the agent's and the service's kubeconfigs",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.nodes < 0 or args.kubelets < 0:
        print("error: --nodes and --kubelets take a count of 0 or more", file=sys.stderr)
        return 2
    try:
        if args.kubelets:
            node_bins_dir()  # not built: one line naming `make kube-bins`, before anything starts
            why = can_make_namespaces()
            if why is not None:
                raise ControlPlaneError(f"real-kubelet nodes need a private mount namespace: {why}")
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
    real_nodes: list[RealNode] = []
    try:
        for i in range(args.nodes):
            create_node(plane.api_client(), f"gpu-node-{i}", gpus=8)
        identities = install_identities(plane) if args.identities or args.kubelets else None
        for i in range(args.kubelets):
            assert identities is not None
            node = RealNode(
                plane,
                f"gpu-kubelet-{i}",
                agent_kubeconfig=identities.agent.kubeconfig,
                workdir=None if args.workdir is None else Path(args.workdir) / f"gpu-kubelet-{i}",
                preset=args.preset,
                agent_config=REAL_NODE_AGENT_CONFIG,
            )
            real_nodes.append(node)
            node.start()
            assert node.agent is not None
            print(
                f"node {node.name}: kubelet log {node.kubelet.log_path}, agent log "
                f"{node.agent.component.log_path}, container requests {node.requests_path}; "
                f"simulator: --simulate {args.preset} --state-dir {node.agent.sim_state}, "
                f"agent config {node.agent.config_path}"
            )
        if args.identities and identities is not None:
            print(f"agent kubeconfig: {identities.agent.kubeconfig.path}")
            print(f"tiering kubeconfig: {identities.tiering.kubeconfig.path}")
        print(f"logs: {plane.logs_dir}")
        print(f"export KUBECONFIG={plane.admin.path}")
        print("serving; Ctrl-C stops every component", flush=True)
        while not stop.wait(1.0):
            plane.check()
            for node in real_nodes:
                node.check()
    except ControlPlaneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        for node in real_nodes:
            node.stop()
        stand_in.stop()
        plane.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
