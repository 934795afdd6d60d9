"""A node run by a real kubelet (``k8s.io/kubernetes/cmd/kubelet``), with nodeagent on it.

:class:`RealNode` is three processes beside the control plane:

- ``fakecri``: Kubernetes' fake CRI runtime (``hack/kube/node``) on a unix socket in the node's
  work directory. It runs no container; every ``CreateContainer`` request the kubelet sends is
  kept, one JSON object a line, and :meth:`RealNode.container_requests` reads them.
- the kubelet, in a private mount namespace of its own (``unshare --mount``), because parts of
  its state live at fixed paths whatever ``--root-dir`` says. Inside that namespace:

  * ``/var/lib/kubelet`` is the node's ``kubelet/`` directory, bind-mounted, so nodeagent
    (outside) reaches the device-plugin, plugin-registry and pod-resources sockets under that
    directory, and several kubelets share one machine;
  * ``/var/log`` is a tmpfs, so ``/var/log/pods`` and ``/var/log/containers`` stay off the host;
  * the kernel settings the kubelet checks are files holding the values it expects,
    bind-mounted over their ``/proc/sys`` entries, with ``protectKernelDefaults: true``: it
    neither writes the host's settings (it would otherwise set ``vm/overcommit_memory``,
    ``kernel/panic``, ``kernel/panic_on_oops``) nor refuses to start;
  * its working directory is an empty scratch directory: a kubelet removing a container whose
    runtime reports no log path deletes what ``*`` matches in its working directory (fakecri
    reports log paths; the scratch directory is the second guard).

  It authenticates with a client certificate for ``system:node:<name>`` (group
  ``system:nodes``), so the API server's Node authorizer limits it as in a cluster, and labels
  its Node :data:`~nodeagent.testing.kube.nodes.REAL_KUBELET_LABEL` so the kubelet stand-in
  leaves its pods alone.
- ``nodeagent run --simulate PRESET`` (:class:`~nodeagent.testing.kube.processes.SimulatedAgent`)
  with the device plugin, pod attribution and (optionally) the DRA plugin pointed at that
  directory.

Everything lives in the node's work directory; :meth:`RealNode.stop` stops the three (every one
also dies with the process that started it) and :meth:`RealNode.keep_logs` copies their logs.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import grpc
import urllib3
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from nodeagent.kubelet.deviceplugin.v1beta1 import api_pb2 as deviceplugin_pb2
from nodeagent.kubelet.deviceplugin.v1beta1 import api_pb2_grpc as deviceplugin_grpc
from nodeagent.kubelet.podresources.v1 import api_pb2 as podresources_pb2
from nodeagent.kubelet.podresources.v1 import api_pb2_grpc as podresources_grpc
from nodeagent.testing.kube import waiting
from nodeagent.testing.kube.controlplane import (
    Component,
    ControlPlane,
    ControlPlaneError,
    Kubeconfig,
    free_port,
)
from nodeagent.testing.kube.nodes import REAL_KUBELET_LABEL, pod_manifest
from nodeagent.testing.kube.processes import NODEAGENT, SimulatedAgent

ENV_NODE_BINS = "NODEAGENT_KUBE_NODE_BINS"
_REPO = Path(__file__).resolve().parents[3]
_BUILD_SCRIPT = _REPO / "hack" / "kube" / "build-node.sh"
NODE_PROGRAMS = ("kubelet", "fakecri")

# The kernel settings kubelet 1.37 checks with protectKernelDefaults (pkg/kubelet/cm
# setupKernelTunables) and the values it wants; each is shown to it as a file with that value.
KERNEL_DEFAULTS = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}

# `sh -c SCRIPT name KUBELET_DIR SYSCTL_DIR SCRATCH PROGRAM ARGS...` inside `unshare --mount`;
# exec at the end so the kubelet keeps the process and its parent-death signal.
_NAMESPACE_SCRIPT = """set -eu
kubelet_dir=$1 sysctl_dir=$2 scratch=$3
shift 3
if [ ! -d /var/lib/kubelet ]; then
  # Nothing to mount on: a tmpfs over /var/lib (this namespace only) makes the mount point.
  mount -t tmpfs tmpfs /var/lib
  mkdir /var/lib/kubelet
fi
mount --bind "$kubelet_dir" /var/lib/kubelet
mount -t tmpfs tmpfs /var/log
for file in "$sysctl_dir"/*; do
  entry=/proc/sys/$(basename "$file" | tr . /)
  if [ -e "$entry" ]; then
    mount --bind "$file" "$entry"
  fi
done
cd "$scratch"
exec "$@"
"""


def node_bins_dir() -> Path:
    """Where kubelet and fakecri are: env ``NODEAGENT_KUBE_NODE_BINS``, else the build's cache.

    Raises ControlPlaneError, one line naming ``make kube-bins``, when they are not built.
    """
    explicit = os.environ.get(ENV_NODE_BINS)
    if explicit:
        directory = Path(explicit)
    else:
        out = subprocess.run(
            ["bash", str(_BUILD_SCRIPT), "--dir"], capture_output=True, text=True, check=False
        )
        if out.returncode != 0 or not out.stdout.strip():
            why = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
            raise ControlPlaneError(f"{_BUILD_SCRIPT} --dir failed: {why}")
        directory = Path(out.stdout.strip().splitlines()[-1])
    missing = [p for p in NODE_PROGRAMS if not (directory / "bin" / p).is_file()]
    if missing:
        raise ControlPlaneError(
            f"node programs missing in {directory}/bin ({', '.join(missing)}); "
            "run `make kube-bins` to build them"
        )
    return directory


def can_make_namespaces() -> str | None:
    """None when this process may make a private mount namespace and mount in it, else why."""
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation=private", "sh", "-c", "mount -t tmpfs t /mnt"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        return f"unshare --mount failed ({probe.stderr.strip() or probe.returncode}); run as root"
    return None


def _kubelet_config(cri_socket: Path, port: int, healthz_port: int) -> dict[str, Any]:
    endpoint = f"unix://{cri_socket}"
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # The test machines have cgroup v1 and no systemd as PID 1 (1.37 refuses v1 by default).
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        "protectKernelDefaults": True,  # see KERNEL_DEFAULTS
        "makeIPTablesUtilChains": False,
        "containerRuntimeEndpoint": endpoint,
        "imageServiceEndpoint": endpoint,
        # Nothing dials the kubelet here; its own ports stay on loopback, open to anyone.
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        # A status every second, so allocatable follows a device's health within about one.
        "nodeStatusUpdateFrequency": "1s",
        "nodeStatusReportFrequency": "1s",
        "syncFrequency": "10s",
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "serializeImagePulls": False,
        "resolvConf": "",
        "kubeAPIQPS": 50,
        "kubeAPIBurst": 100,
    }


class RealNode:
    """A kubelet + fakecri + nodeagent node joined to ``plane`` (see the module docstring).

    ``agent_kubeconfig`` is the agent's identity (the deploy manifests' ServiceAccount);
    ``agent_config`` is merged over a config with the device plugin and pod attribution on;
    ``agent=False`` starts the kubelet and runtime only.
    """

    def __init__(
        self,
        plane: ControlPlane,
        name: str,
        *,
        agent_kubeconfig: Kubeconfig,
        workdir: Path | None = None,
        preset: str = "dgx-h100",
        agent_config: Mapping[str, Any] | None = None,
        agent: bool = True,
        bins: Path | None = None,
    ) -> None:
        self.plane = plane
        self.name = name
        self.bin = (bins or node_bins_dir()) / "bin"
        self._owns_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=f"nodeagent-{name}-"))
        self.kubelet_dir = self.workdir / "kubelet"
        self.scratch = self.workdir / "kubelet-cwd"
        self.requests_path = self.workdir / "container-requests.jsonl"
        self.cri_socket = self.workdir / "cri.sock"
        self.cdi_dir = self.workdir / "cdi"
        # fakecri fails CreateContainer for a pod while a file <namespace>_<pod> is here.
        self.hold_dir = self.workdir / "hold"
        self.pod_resources_socket = self.kubelet_dir / "pod-resources" / "kubelet.sock"
        for directory in (
            self.kubelet_dir,
            self.scratch,
            self.cdi_dir,
            self.hold_dir,
            self.workdir / "sysctl",
        ):
            directory.mkdir(parents=True, exist_ok=True)
        self.requests_path.touch()
        # A file the kubelet must never delete (see the module docstring).
        self.canary = self.scratch / "canary"
        self.canary.write_text("a kubelet removing files in its working directory ends here\n")
        self.core = client.CoreV1Api(plane.api_client())
        self.fakecri = Component(
            f"fakecri on {name}",
            [
                str(self.bin / "fakecri"),
                f"--endpoint=unix://{self.cri_socket}",
                f"--requests={self.requests_path}",
                f"--hold-dir={self.hold_dir}",
            ],
            self.workdir / "fakecri.log",
            cwd=self.scratch,
        )
        self.kubelet = Component(
            f"kubelet on {name}",
            self._kubelet_argv(),
            self.workdir / "kubelet.log",
            cwd=self.scratch,
        )
        self.agent: SimulatedAgent | None = None
        if agent:
            base: dict[str, Any] = {
                "device_plugin": {
                    "enabled": True,
                    "kubelet_dir": str(self.kubelet_dir / "device-plugins"),
                    "cdi_spec_dir": str(self.cdi_dir),
                    "mps": {"root": str(self.workdir / "mps")},
                },
                "metrics": {
                    "pod_attribution": True,
                    "pod_resources_socket": str(
                        self.kubelet_dir / "pod-resources" / "kubelet.sock"
                    ),
                    "pod_resources_interval_s": 1.0,
                },
                "dra": {
                    "registry_dir": str(self.kubelet_dir / "plugins_registry"),
                    "plugin_dir": str(self.kubelet_dir / "plugins"),
                    "cdi_spec_dir": str(self.cdi_dir),
                    "mps_root": str(self.workdir / "dra-mps"),
                },
            }
            for key, value in (agent_config or {}).items():
                if isinstance(value, dict) and isinstance(base.get(key), dict):
                    base[key] = {**base[key], **value}
                else:
                    base[key] = value
            self.agent = SimulatedAgent(
                name, agent_kubeconfig, self.workdir / "agent", preset=preset, config=base
            )

    # setup

    def _kubelet_argv(self) -> list[str]:
        cert = self.plane.ca.issue(f"system:node:{self.name}", organization="system:nodes")
        kubeconfig = self.workdir / "kubelet.kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "local",
                            "cluster": {
                                "server": self.plane.url,
                                "certificate-authority": str(self.plane.ca.cert_path),
                            },
                        }
                    ],
                    "users": [
                        {
                            "name": "node",
                            "user": {
                                "client-certificate": str(cert.cert),
                                "client-key": str(cert.key),
                            },
                        }
                    ],
                    "contexts": [{"name": "node", "context": {"cluster": "local", "user": "node"}}],
                    "current-context": "node",
                }
            )
        )
        config = self.workdir / "kubelet-config.yaml"
        config.write_text(
            yaml.safe_dump(_kubelet_config(self.cri_socket, free_port(), free_port()))
        )
        sysctl = self.workdir / "sysctl"
        for entry, value in KERNEL_DEFAULTS.items():
            (sysctl / entry.replace("/", ".")).write_text(value + "\n")
        return [
            "unshare",
            "--mount",
            "--propagation=private",
            "sh",
            "-c",
            _NAMESPACE_SCRIPT,
            "kubelet-namespace",
            str(self.kubelet_dir),
            str(sysctl),
            str(self.scratch),
            str(self.bin / "kubelet"),
            f"--config={config}",
            f"--kubeconfig={kubeconfig}",
            "--root-dir=/var/lib/kubelet",
            f"--hostname-override={self.name}",
            f"--node-labels={REAL_KUBELET_LABEL}=real",
            "--v=2",
        ]

    # lifecycle

    def __enter__(self) -> RealNode:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self, timeout_s: float = 60.0) -> None:
        """Start the runtime, the kubelet (until the Node is Ready) and the agent."""
        try:
            self.fakecri.start()
            self._wait(self.fakecri, timeout_s, self.cri_socket.exists, "serving its socket")
            self.start_kubelet(timeout_s)
            if self.agent is not None:
                self.agent.start()
        except BaseException:
            self.stop()
            raise

    def start_kubelet(self, timeout_s: float = 60.0) -> None:
        """Start the kubelet; wait until its Node is Ready and it has its pods from the API
        server. Until that first sync it keeps the devices its checkpoint gives pods deleted
        meanwhile, and a GPU pod it admits then fails with UnexpectedAdmissionError."""
        log_size = self.kubelet.log_path.stat().st_size if self.kubelet.log_path.exists() else 0
        self.kubelet.start()
        self.wait_node(
            lambda node: _ready(node),
            what=f"kubelet on {self.name}: node Ready",
            timeout_s=timeout_s,
        )

        def synced() -> bool:
            with self.kubelet.log_path.open("rb") as log:
                log.seek(log_size)
                return b'"SyncLoop ADD" source="api"' in log.read()

        self._wait(self.kubelet, timeout_s, synced, "syncing its pods from the API server")

    def stop_kubelet(self) -> None:
        """Stop the kubelet (SIGTERM), as a restart or an upgrade would."""
        self.kubelet.stop()

    def stop(self) -> None:
        """Stop the agent, the kubelet and the runtime; remove an own work directory."""
        if self.agent is not None:
            self.agent.stop()
        self.kubelet.stop()
        self.fakecri.stop()
        # A stopped kubelet leaves its Node behind, NotReady: other tests on the same control
        # plane would count it among their nodes. Best effort: when the API server is already
        # gone there is nothing to clean, and what is still running must be stopped regardless.
        with contextlib.suppress(ApiException, urllib3.exceptions.HTTPError, OSError):
            self.core.delete_node(self.name, _request_timeout=10)
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def check(self) -> None:
        """Raise ControlPlaneError naming a process that exited on its own."""
        for component in (self.fakecri, self.kubelet):
            if component.process is not None and component.process.poll() is not None:
                raise ControlPlaneError(
                    f"{component.name} exited with {component.process.returncode}; "
                    f"log {component.log_path}:\n{component.tail()}"
                )

    def keep_logs(self, destination: Path) -> Path:
        """Copy the kubelet's, the runtime's and the agent's logs (and the container
        requests) to ``destination``; returns it."""
        destination.mkdir(parents=True, exist_ok=True)
        for path in (
            self.kubelet.log_path,
            self.fakecri.log_path,
            self.requests_path,
            self.workdir / "agent" / "agent.log",
        ):
            if path.exists():
                shutil.copy(path, destination / f"{self.name}-{path.name}")
        return destination

    def _wait(self, component: Component, timeout_s: float, ready: Any, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if not component.running:
                raise ControlPlaneError(
                    f"{component.name} exited while {what}; log {component.log_path}:\n"
                    f"{component.tail()}"
                )
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"{component.name}: not {what} after {timeout_s:.0f}s")
            time.sleep(0.05)

    # what the node shows

    def log_tail(self, lines: int = 30) -> str:
        """The end of the kubelet's and the agent's logs, for failure messages."""
        parts = [f"{self.kubelet.name} log {self.kubelet.log_path}:\n{self.kubelet.tail(lines)}"]
        if self.agent is not None:
            parts.append(self.agent.log(lines))
        return "\n".join(parts)

    def wait_node(self, predicate: Any, *, what: str, timeout_s: float = 30.0) -> Any:
        """Watch this Node until ``predicate(node)`` is truthy; its value. The timeout's
        message names ``what`` and ends with the kubelet's and the agent's logs."""
        return waiting.until(
            self.core.list_node,
            lambda nodes: predicate(nodes.get(self.name)) if self.name in nodes else None,
            what=lambda: f"{what}\n{self.log_tail()}",
            timeout_s=timeout_s,
            field_selector=f"metadata.name={self.name}",
        )

    def wait_allocatable(self, resource: str, count: int, *, timeout_s: float = 30.0) -> None:
        """Until the Node's allocatable ``resource`` is ``count``."""
        self.wait_node(
            lambda node: _quantity(node, "allocatable", resource) == count or None,
            what=f"kubelet on {self.name}: allocatable {resource} = {count}",
            timeout_s=timeout_s,
        )

    def registrations(self, resource: str) -> int:
        """How many times the kubelet (over all its runs) accepted a device plugin's
        registration for ``resource``, from its log."""
        needle = f'registration request from device plugin with resource" resourceName="{resource}"'
        return self.kubelet.log_path.read_text(errors="replace").count(needle)

    def wait_registered(self, resource: str, more_than: int, *, timeout_s: float = 30.0) -> None:
        """Until the kubelet has accepted more than ``more_than`` registrations of ``resource``.
        Polls its log: the kubelet tells nothing else (node status keeps the old capacity)."""
        deadline = time.monotonic() + timeout_s
        while self.registrations(resource) <= more_than:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"kubelet on {self.name}: no new registration of {resource} from the "
                    f"device plugin within {timeout_s:.0f}s\n{self.log_tail()}"
                )
            time.sleep(0.1)

    def wait_devices(self, resource: str, count: int, *, timeout_s: float = 30.0) -> None:
        """Until the kubelet's device manager holds ``count`` healthy ``resource`` devices
        (pod-resources ``GetAllocatableResources``). After a kubelet restart the Node keeps
        its old allocatable while the device manager has none yet: a pod admitted then fails
        with UnexpectedAdmissionError, so tests wait on the device manager itself."""
        deadline = time.monotonic() + timeout_s
        seen: list[str] = []
        while True:
            try:
                seen = self.allocatable_devices().get(resource, [])
            except grpc.RpcError:
                seen = []  # the kubelet is (re)starting its pod-resources server
            if len(seen) == count:
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"kubelet on {self.name}: device manager holds {len(seen)} {resource}, "
                    f"not {count}, after {timeout_s:.0f}s\n{self.log_tail()}"
                )
            time.sleep(0.1)

    def container_requests(self) -> Iterator[dict[str, Any]]:
        """Every CreateContainer request the kubelet sent the runtime, oldest first (CRI JSON,
        proto field names: ``config.envs``, ``config.devices``, ``config.CDI_devices``...)."""
        for line in self.requests_path.read_text().splitlines():
            if line.strip():
                yield json.loads(line)

    def container_request(self, namespace: str, pod: str) -> dict[str, Any] | None:
        """The latest CreateContainer request for ``namespace/pod``'s first container."""
        found = None
        for request in self.container_requests():
            meta = request.get("sandbox_config", {}).get("metadata", {})
            if meta.get("namespace") == namespace and meta.get("name") == pod:
                found = request
        return found

    def hold_containers(self, namespace: str, pod: str) -> None:
        """Make fakecri fail CreateContainer for ``namespace/pod`` until :meth:`release_containers`:
        the kubelet admits the pod and prepares its resources, and its container never starts."""
        (self.hold_dir / f"{namespace}_{pod}").touch()

    def release_containers(self, namespace: str, pod: str) -> None:
        """Let fakecri create ``namespace/pod``'s containers again."""
        (self.hold_dir / f"{namespace}_{pod}").unlink(missing_ok=True)

    def dra_checkpoint(self) -> list[dict[str, Any]]:
        """The claims in the kubelet's DRA checkpoint (``dra_manager_state``: its
        ``ClaimInfoStateList``, each with ``ClaimName``, ``Namespace``, ``PodUIDs`` and per
        driver the prepared ``Devices``); empty when there is no checkpoint yet."""
        path = self.kubelet_dir / "dra_manager_state"
        if not path.exists():
            return []
        data = json.loads(json.loads(path.read_text())["Data"])
        return list(data.get("ClaimInfoStateList") or [])

    def in_kubelet_namespace(self, *argv: str) -> str:
        """Run ``argv`` in the running kubelet's mount namespace (``nsenter --mount``), where
        its fixed paths (``/var/lib/kubelet/...``) are; stdout. AssertionError when it fails."""
        process = self.kubelet.process
        if process is None or process.poll() is not None:
            raise AssertionError(f"{self.kubelet.name} is not running")
        result = subprocess.run(
            ["nsenter", f"--mount=/proc/{process.pid}/ns/mnt", *argv],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise AssertionError(
                f"{' '.join(argv)} in {self.kubelet.name}'s mount namespace exited "
                f"{result.returncode}: {result.stderr.strip()}"
            )
        return result.stdout

    def kubelet_log(self) -> str:
        """The kubelet's log over all its runs."""
        return self.kubelet.log_path.read_text(errors="replace")

    def gpu_index(self, uuid: str) -> int:
        """The index of the simulated GPU ``uuid`` (for ``sim inject --gpu``)."""
        for gpu in json.loads(self.sim("gpus", "--json")):
            if gpu["uuid"] == uuid:
                return int(gpu["index"])
        raise AssertionError(f"no GPU {uuid} on {self.name}")

    # the agent

    def sim(self, *args: str) -> str:
        """``nodeagent ARGS... --simulate PRESET --state-dir STATE`` on this node's simulated
        GPUs (``sim inject``, ``sim process add``, ``mig apply``, ``processes``...); stdout.
        Raises AssertionError with the command's stderr when it fails."""
        assert self.agent is not None, f"{self.name} runs no agent"
        argv = [*NODEAGENT, *args, "--simulate", self.agent.preset]
        argv += ["--state-dir", str(self.agent.sim_state)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
        result = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
        if result.returncode != 0:
            raise AssertionError(
                f"nodeagent {' '.join(args)} on {self.name} exited {result.returncode}: "
                f"{result.stderr.strip()}\n{result.stdout.strip()[-2000:]}"
            )
        return result.stdout

    def reconfigure_agent(self, changes: Mapping[str, Any]) -> None:
        """Merge ``changes`` (section -> values) into the agent's config and restart it, as a
        rollout of a new ConfigMap would."""
        assert self.agent is not None, f"{self.name} runs no agent"
        document = yaml.safe_load(self.agent.config_path.read_text())
        for key, value in changes.items():
            if isinstance(value, dict) and isinstance(document.get(key), dict):
                document[key] = {**document[key], **value}
            else:
                document[key] = value
        self.agent.stop()
        self.agent.config_path.write_text(yaml.safe_dump(document))
        self.agent.start()

    # pods

    def pod(self, name: str, resources: Mapping[str, str] | None = None) -> dict[str, Any]:
        """A one-container pod for this node (kube-scheduler places it by the hostname label)
        with ``resources`` as limits, and no ServiceAccount token (no volume to set up)."""
        manifest = pod_manifest(
            name,
            resources=resources,
            node_selector={"kubernetes.io/hostname": self.name},
        )
        manifest["spec"]["automountServiceAccountToken"] = False
        manifest["spec"]["terminationGracePeriodSeconds"] = 0
        return manifest

    def run_pod(
        self, namespace: str, name: str, resources: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """Create the pod and wait until the kubelet reports it Running; the pod."""
        self.core.create_namespaced_pod(namespace, self.pod(name, resources))  # type: ignore[arg-type]  # plain dicts work
        return self.wait_pod(namespace, name, "Running")

    def wait_pod(
        self, namespace: str, name: str, phase: str, *, timeout_s: float = 60.0
    ) -> dict[str, Any]:
        """Watch ``namespace/name`` until its phase is ``phase``; the pod. The message of a
        timeout names the pod, its status and the kubelet's and agent's logs."""
        return waiting.pods(
            self.plane.api_client(),
            namespace,
            lambda pods: (
                pods.get(name)
                if (pods.get(name) or {}).get("status", {}).get("phase") == phase
                else None
            ),
            what=lambda: (
                f"kubelet on {self.name}: pod {namespace}/{name} {phase}\n" + self.log_tail()
            ),
            timeout_s=timeout_s,
        )

    def delete_pod(self, namespace: str, name: str, *, timeout_s: float = 60.0) -> None:
        """Delete the pod and wait until the kubelet has finished it: the object is gone and
        no claim in the kubelet's DRA checkpoint names the pod (the object can go before the
        kubelet has unprepared its claims, and a test after this one must find the devices
        free)."""
        metadata = self.core.read_namespaced_pod(name, namespace).metadata
        uid = metadata.uid if metadata is not None else None
        if not uid:
            raise AssertionError(f"pod {namespace}/{name} has no uid")
        self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        waiting.pods(
            self.plane.api_client(),
            namespace,
            lambda pods: name not in pods or None,
            what=lambda: (
                f"kubelet on {self.name}: pod {namespace}/{name} deleted\n" + self.log_tail()
            ),
            timeout_s=timeout_s,
        )
        eventually(
            lambda: not any(uid in (c.get("PodUIDs") or {}) for c in self.dra_checkpoint()),
            what=lambda: (
                f"kubelet on {self.name}: the claims of pod {namespace}/{name} unprepared\n"
                + self.log_tail()
            ),
            timeout_s=timeout_s,
        )

    # the kubelet's gRPC APIs, as nodeagent reads them

    def pod_devices(self) -> dict[tuple[str, str], dict[str, list[str]]]:
        """The kubelet's pod-resources ``List``: (namespace, pod) -> resource -> device IDs."""
        with grpc.insecure_channel(f"unix://{self.pod_resources_socket}") as channel:
            stub = podresources_grpc.PodResourcesListerStub(channel)
            answer = stub.List(podresources_pb2.ListPodResourcesRequest(), timeout=5)
        found: dict[tuple[str, str], dict[str, list[str]]] = {}
        for pod in answer.pod_resources:
            held = found.setdefault((pod.namespace, pod.name), {})
            for container in pod.containers:
                for devices in container.devices:
                    held.setdefault(devices.resource_name, []).extend(devices.device_ids)
        return found

    def allocatable_devices(self) -> dict[str, list[str]]:
        """The kubelet's pod-resources ``GetAllocatableResources``: resource -> device IDs."""
        with grpc.insecure_channel(f"unix://{self.pod_resources_socket}") as channel:
            stub = podresources_grpc.PodResourcesListerStub(channel)
            answer = stub.GetAllocatableResources(
                podresources_pb2.AllocatableResourcesRequest(), timeout=5
            )
        found: dict[str, list[str]] = {}
        for devices in answer.devices:
            found.setdefault(devices.resource_name, []).extend(devices.device_ids)
        return found

    def preferred(self, socket_name: str, available: list[str], size: int) -> list[str]:
        """Ask the device plugin serving ``device-plugins/<socket_name>`` which ``size`` of
        ``available`` it prefers, as the kubelet does before ``Allocate``."""
        path = self.kubelet_dir / "device-plugins" / socket_name
        with grpc.insecure_channel(f"unix://{path}") as channel:
            stub = deviceplugin_grpc.DevicePluginStub(channel)
            answer = stub.GetPreferredAllocation(
                deviceplugin_pb2.PreferredAllocationRequest(
                    container_requests=[
                        deviceplugin_pb2.ContainerPreferredAllocationRequest(
                            available_deviceIDs=available, allocation_size=size
                        )
                    ]
                ),
                timeout=5,
            )
        return list(answer.container_responses[0].deviceIDs)


T = TypeVar("T")


def eventually(check: Callable[[], T | None], what: Callable[[], str], timeout_s: float) -> T:
    """Poll ``check`` until it is truthy; its value. For what lives in the node's files and
    logs (the kubelet's checkpoints, the agent's log, the simulator), which has nothing to watch;
    AssertionError naming ``what()`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what()} (after {timeout_s:.0f}s)")
        time.sleep(0.1)


def _ready(node: dict[str, Any]) -> bool | None:
    for condition in node.get("status", {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return condition.get("status") == "True" or None
    return None


def _quantity(node: dict[str, Any] | None, field: str, resource: str) -> int | None:
    if node is None:
        return None
    value = (node.get("status", {}).get(field) or {}).get(resource)
    return None if value is None else int(value)


def container_env(request: Mapping[str, Any]) -> dict[str, str]:
    """A CreateContainer request's environment as a dict. CRI 1.37 carries values as bytes,
    which protobuf's JSON writes in base64."""
    return {
        e["key"]: base64.b64decode(e.get("value", "")).decode()
        for e in request.get("config", {}).get("envs", [])
    }
