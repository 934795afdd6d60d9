"""A real Kubernetes control plane on loopback: etcd, kube-apiserver and, on request,
kube-scheduler, kube-controller-manager and Kueue, built from pinned modules (``make kube-bins``).

What it sets up, and why:

- etcd and kube-apiserver on free loopback ports, in a temporary directory that holds the data,
  the generated certificates (one CA signs the API server's and Kueue's webhook serving certs),
  the service-account key pair and one kubeconfig per identity.
- Authentication by a static token file: ``admin`` (group ``system:masters``), and the
  scheduler's and controller manager's own users (``system:kube-scheduler``,
  ``system:kube-controller-manager``), so the bootstrap RBAC policy applies to them as in a real
  cluster. Authorization is ``Node,RBAC``. Components of nodeagent under test get
  ServiceAccount tokens through the TokenRequest API
  (:meth:`ControlPlane.service_account_kubeconfig`), so a verb missing from a Role fails the
  test that needs it.
- There are no kubelets. Nodes are created Ready by :mod:`nodeagent.testing.kube.nodes`, which
  also plays the kubelet's part for their pods (running them, finishing deletions). Because no
  kubelet renews node Leases, kube-controller-manager runs every default controller except the
  node lifecycle controller (it would mark the nodes NotReady after the grace period and taint
  them), and the ``TaintNodesByCondition`` admission plugin is off (it taints new nodes
  ``not-ready`` until the lifecycle controller sees them Ready).
- Kueue runs with its CRDs from its module, internal certificate management off, and its
  webhooks served on loopback with a certificate from the CA above; the webhook configurations
  from its module are rewritten to ``url: https://127.0.0.1:PORT/...`` with that CA.

Every process is started with ``PR_SET_PDEATHSIG`` so that it dies with the process that started
it, even when that one is killed -9, and :meth:`ControlPlane.stop` stops them all otherwise.
Each component logs to ``<workdir>/logs/<name>.log``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from nodeagent.testing.kube.audit import AuditedRequest, audit_mark, read_audit
from nodeagent.testing.kube.certs import CertificateAuthority, CertPair, service_account_keys

log = logging.getLogger(__name__)

ENV_BINS = "NODEAGENT_KUBE_BINS"
_REPO = Path(__file__).resolve().parents[3]
_BUILD_SCRIPT = _REPO / "hack" / "kube" / "build.sh"
PROGRAMS = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubectl")
ADMIN_TOKEN_USER = "admin"  # noqa: S105 - a user name, not a secret
SERVICE_CIDR = "10.96.0.0/16"
# Controllers that need a kubelet to make sense (see the module docstring).
CONTROLLERS = "*,-node-lifecycle-controller"
_PR_SET_PDEATHSIG = 1
# Where the Kueue manager reads its metrics certificate without internal cert management
# (sigs.k8s.io/kueue cmd/kueue/main.go, v0.17.0); not configurable there.
KUEUE_METRICS_CERTS = Path("/etc/kueue/metrics/certs")
# Run as `sh -c SCRIPT name SCRATCH CERTS_DIR CERT KEY PROGRAM ARGS...` inside `unshare --mount`:
# /etc becomes an overlay whose writable layer is a tmpfs of this namespace only; then exec, so
# the program keeps the process (and its parent-death signal).
_KUEUE_NAMESPACE_SCRIPT = """set -eu
scratch=$1 certs=$2 cert=$3 key=$4
shift 4
mount -t tmpfs tmpfs "$scratch"
mkdir "$scratch/upper" "$scratch/work"
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$scratch/upper,workdir=$scratch/work" /etc
mkdir -p "$certs"
cp "$cert" "$certs/tls.crt"
cp "$key" "$certs/tls.key"
exec "$@"
"""


class ControlPlaneError(RuntimeError):
    """A component did not start or stopped; the message names it and its log."""


def bins_dir(*, kueue: bool = True) -> Path:
    """Where the pinned programs are: env ``NODEAGENT_KUBE_BINS``, else the build's cache dir.

    ``kueue``: the Kueue manager is needed too (a plane without Kueue starts without it).

    Raises ControlPlaneError, one line naming the missing programs and ``make kube-bins``,
    when they have not been built.
    """
    explicit = os.environ.get(ENV_BINS)
    if explicit:
        directory = Path(explicit)
    else:
        if not _BUILD_SCRIPT.is_file():
            raise ControlPlaneError(f"set {ENV_BINS} to the directory `make kube-bins` printed")
        out = subprocess.run(
            ["bash", str(_BUILD_SCRIPT), "--dir"], capture_output=True, text=True, check=False
        )
        if out.returncode != 0 or not out.stdout.strip():
            why = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
            raise ControlPlaneError(f"{_BUILD_SCRIPT} --dir failed: {why}")
        directory = Path(out.stdout.strip().splitlines()[-1])
    wanted = (*PROGRAMS, "kueue") if kueue else PROGRAMS
    missing = [p for p in wanted if not (directory / "bin" / p).is_file()]
    if missing:
        raise ControlPlaneError(
            f"control plane programs missing in {directory}/bin ({', '.join(missing)}); "
            "run `make kube-bins` to build them"
        )
    return directory


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL it when the starting process dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@dataclass
class Component:
    """One program of the control plane, run as a child process."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    cwd: Path | None = None
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the program with its output appended to its log."""
        with self.log_path.open("ab") as out:
            out.write(f"--- start {time.strftime('%H:%M:%S')}: {' '.join(self.argv)}\n".encode())
        # The log file stays open in the child only.
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=self.cwd,
                preexec_fn=_die_with_parent,
                start_new_session=True,  # Ctrl-C in a terminal reaches the harness, not these
            )

    @property
    def running(self) -> bool:
        """Whether the process is alive."""
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.process = None

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(5)
        self.process = None

    def tail(self, lines: int = 20) -> str:
        """The last lines of the log, for error messages."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])


# Audit what nodeagent's components do, not the harness (admin), the control plane's own
# programs or Kueue (which runs as admin): tests and benchmarks count those requests.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {
            "level": "None",
            "users": [
                "admin",
                "system:kube-scheduler",
                "system:kube-controller-manager",
                "system:apiserver",
            ],
        },
        {"level": "None", "userGroups": ["system:serviceaccounts:kube-system", "system:nodes"]},
        {"level": "Metadata"},
    ],
}


@dataclass
class Kubeconfig:
    """A kubeconfig file for one identity."""

    path: Path
    server: str
    ca_path: Path
    token: str


@dataclass
class ControlPlane:
    """etcd + kube-apiserver (+ scheduler, controller manager, Kueue), on loopback.

    Use as a context manager, or call :meth:`start` and :meth:`stop`. ``feature_gates`` go to
    every Kubernetes component; ``runtime_config`` to kube-apiserver (for API groups that are
    not on by default); ``apiserver_args`` are added to kube-apiserver's command line.
    """

    scheduler: bool = False
    controller_manager: bool = False
    kueue: bool = False
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    runtime_config: Sequence[str] = ()
    apiserver_args: Sequence[str] = ()
    workdir: Path | None = None
    bins: Path | None = None
    keep_workdir: bool = False
    components: dict[str, Component] = field(default_factory=dict, init=False)
    started_s: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        # The programs first: a plane that cannot start leaves no work directory behind.
        self._bin_root = self.bins or bins_dir(kueue=self.kueue)
        self._owns_workdir = self.workdir is None
        self.workdir = Path(self.workdir or tempfile.mkdtemp(prefix="nodeagent-cp-"))
        self.logs_dir = self.workdir / "logs"
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self.bin = self._bin_root / "bin"
        self.kueue_manifests = self._bin_root / "kueue"
        self._tokens: dict[str, str] = {}
        self.etcd_port = 0
        self.apiserver_port = 0
        self.webhook_port = 0

    # lifecycle

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self, timeout_s: float = 60.0) -> None:
        """Start every requested component and wait until each is ready."""
        begin = time.monotonic()
        assert self.workdir is not None
        pki = self.workdir / "pki"
        pki.mkdir(exist_ok=True)
        self.ca = CertificateAuthority(pki)
        self.serving: CertPair = self.ca.issue("kube-apiserver")
        self.sa_keys = service_account_keys(pki)
        self._write_tokens(pki / "tokens.csv")
        try:
            self._start_etcd(timeout_s)
            self._start_apiserver(timeout_s)
            self.admin = self._kubeconfig("admin", ADMIN_TOKEN_USER)
            if self.controller_manager:
                self._start_kube_program("kube-controller-manager")
            if self.scheduler:
                self._start_kube_program("kube-scheduler")
            if self.kueue:
                self._start_kueue(timeout_s)
        except BaseException:
            self.stop()
            raise
        self.started_s = time.monotonic() - begin
        log.info("control plane ready in %.1fs (%s)", self.started_s, ", ".join(self.components))

    def stop(self) -> None:
        """Stop every component (Kueue and controllers first, etcd last); remove the workdir."""
        for name in reversed(list(self.components)):
            self.components[name].stop()
        if self._owns_workdir and not self.keep_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def check(self) -> None:
        """Raise ControlPlaneError naming any component that exited on its own."""
        for component in self.components.values():
            if component.process is not None and component.process.poll() is not None:
                raise ControlPlaneError(
                    f"{component.name} exited with {component.process.returncode}; "
                    f"log {component.log_path}:\n{component.tail()}"
                )

    # identities and clients

    @property
    def url(self) -> str:
        """The API server's base URL."""
        return f"https://127.0.0.1:{self.apiserver_port}"

    def _write_tokens(self, path: Path) -> None:
        users = {
            ADMIN_TOKEN_USER: "system:masters",
            "system:kube-scheduler": "",
            "system:kube-controller-manager": "",
        }
        lines = []
        for user, groups in users.items():
            token = os.urandom(16).hex()
            self._tokens[user] = token
            lines.append(f'{token},{user},{user},"{groups}"')
        path.write_text("\n".join(lines) + "\n")
        path.chmod(0o600)
        self.token_file = path

    def _kubeconfig(self, name: str, user: str) -> Kubeconfig:
        return self.write_kubeconfig(name, self._tokens[user])

    def write_kubeconfig(self, name: str, token: str) -> Kubeconfig:
        """A kubeconfig for ``token`` at ``<workdir>/<name>.kubeconfig``."""
        assert self.workdir is not None
        path = self.workdir / f"{name}.kubeconfig"
        document = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "local",
                    "cluster": {
                        "server": self.url,
                        "certificate-authority": str(self.ca.cert_path),
                    },
                }
            ],
            "users": [{"name": name, "user": {"token": token}}],
            "contexts": [{"name": name, "context": {"cluster": "local", "user": name}}],
            "current-context": name,
        }
        path.write_text(yaml.safe_dump(document))
        path.chmod(0o600)
        return Kubeconfig(path, self.url, self.ca.cert_path, token)

    def api_client(self, kubeconfig: Kubeconfig | None = None) -> Any:
        """A ``kubernetes.client.ApiClient`` for ``kubeconfig`` (default: the admin)."""
        from kubernetes import client

        kc = kubeconfig or self.admin
        configuration = client.Configuration()
        configuration.host = kc.server
        configuration.ssl_ca_cert = str(kc.ca_path)
        configuration.api_key = {"authorization": f"Bearer {kc.token}"}
        return client.ApiClient(configuration)

    def service_account_kubeconfig(
        self, namespace: str, name: str, expiration_s: int = 86400
    ) -> Kubeconfig:
        """Create ServiceAccount ``namespace/name`` if needed and a kubeconfig with its token."""
        self.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts",
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
            ok=(201, 409),
        )
        answer = self.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": expiration_s},
            },
        )
        return self.write_kubeconfig(f"sa-{namespace}-{name}", answer["status"]["token"])

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        ok: Sequence[int] = (200, 201),
        content_type: str = "application/json",
        token: str | None = None,
        timeout_s: float = 30.0,
    ) -> Any:
        """One raw API call as the admin (or ``token``); the JSON answer, or ControlPlaneError."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)  # noqa: S310
        req.add_header("Authorization", f"Bearer {token or self._tokens[ADMIN_TOKEN_USER]}")
        if data is not None:
            req.add_header("Content-Type", content_type)
        context = ssl.create_default_context(cafile=str(self.ca.cert_path))
        try:
            with urllib.request.urlopen(req, timeout=timeout_s, context=context) as resp:  # noqa: S310
                status, payload = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            status, payload = exc.code, exc.read()
        if status not in ok:
            raise ControlPlaneError(
                f"kube-apiserver answered {status} to {method} {path}: {payload[:500]!r}"
            )
        if not payload:
            return {}
        try:
            return json.loads(payload)
        except ValueError:  # /readyz, /healthz and friends answer text
            return payload.decode(errors="replace")

    def apply(self, documents: Sequence[Mapping[str, Any]] | str | Path) -> str:
        """``kubectl apply --server-side`` of manifests (a file, YAML text or documents)."""
        if isinstance(documents, Path):
            text = documents.read_text()
        elif isinstance(documents, str):
            text = documents
        else:
            text = yaml.safe_dump_all(list(documents))
        return self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=text)

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        """Run the pinned kubectl as the admin; stdout, or ControlPlaneError with stderr."""
        result = subprocess.run(
            [str(self.bin / "kubectl"), "--kubeconfig", str(self.admin.path), *args],
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
        )
        if check and result.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    # namespaces

    def create_namespace(self, name: str) -> None:
        """Create a namespace and its default ServiceAccount at once (the ServiceAccount
        admission plugin refuses pods until it exists; the controller manager's own copy may
        come a moment later, or never when it does not run)."""
        self.request(
            "POST",
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
            ok=(201, 409),
        )
        self.request(
            "POST",
            f"/api/v1/namespaces/{name}/serviceaccounts",
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}},
            ok=(201, 409),
        )
        if self.kueue and name != "kueue-system":
            self._wait_admission_sees(name)

    def _wait_admission_sees(self, namespace: str, timeout_s: float = 10.0) -> None:
        """Kueue's pod webhook looks namespaces up in its informer cache, which learns of a new
        one a moment after it is created; until then it refuses pods there (NotFound)."""
        probe = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "admission-probe"},
            "spec": {"containers": [{"name": "c", "image": "registry.invalid/probe:1"}]},
        }
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.request("POST", f"/api/v1/namespaces/{namespace}/pods?dryRun=All", probe)
                return
            except ControlPlaneError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def delete_namespace(self, name: str) -> None:
        """Delete a namespace (its objects go with it once the namespace controller runs)."""
        self.request("DELETE", f"/api/v1/namespaces/{name}", ok=(200, 202, 404))

    # etcd

    def _start_etcd(self, timeout_s: float) -> None:
        assert self.workdir is not None
        self.etcd_port, peer = free_port(), free_port()
        client_url = f"http://127.0.0.1:{self.etcd_port}"
        peer_url = f"http://127.0.0.1:{peer}"
        component = Component(
            "etcd",
            [
                str(self.bin / "etcd"),
                "--name=default",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                # Tests never need durability across a power cut; fsync dominates on slow disks.
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
            self.logs_dir / "etcd.log",
        )
        self.components["etcd"] = component
        component.start()
        self._wait(component, timeout_s, lambda: self._etcd_healthy())

    def _etcd_healthy(self) -> bool:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.etcd_port}/health", timeout=2
            ) as resp:
                return bool(json.loads(resp.read()).get("health") == "true")
        except (OSError, ValueError):
            return False

    def _etcd_call(self, path: str, body: Mapping[str, Any]) -> Any:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.etcd_port}{path}",
            data=json.dumps(body).encode(),
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310
            return json.loads(resp.read())

    def etcd_revision(self) -> int:
        """etcd's current revision (what the API server reports as resourceVersion)."""
        answer = self._etcd_call("/v3/kv/range", {"key": "AA=="})  # key "\0": any key works
        return int(answer["header"]["revision"])

    def compact_etcd(self) -> int:
        """Compact etcd's history up to now, as the API server does every 5 minutes; returns
        the revision. Watches from before it then end with ``410 Gone``."""
        revision = self.etcd_revision()
        self._etcd_call("/v3/kv/compaction", {"revision": str(revision), "physical": True})
        return revision

    # kube-apiserver

    def _feature_gate_flag(self) -> list[str]:
        if not self.feature_gates:
            return []
        gates = ",".join(f"{k}={'true' if v else 'false'}" for k, v in self.feature_gates.items())
        return [f"--feature-gates={gates}"]

    def _start_apiserver(self, timeout_s: float) -> None:
        assert self.workdir is not None
        if not self.apiserver_port:
            self.apiserver_port = free_port()
        argv = [
            str(self.bin / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            # The `kubernetes` Service's endpoints may not point at loopback; nothing here
            # reaches the API server through that Service.
            "--endpoint-reconciler-type=none",
            f"--secure-port={self.apiserver_port}",
            f"--tls-cert-file={self.serving.cert}",
            f"--tls-private-key-file={self.serving.key}",
            f"--client-ca-file={self.ca.cert_path}",
            f"--token-auth-file={self.token_file}",
            "--authorization-mode=Node,RBAC",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={self.sa_keys.cert}",
            f"--service-account-signing-key-file={self.sa_keys.key}",
            "--disable-admission-plugins=TaintNodesByCondition",
            "--allow-privileged=true",
            "--profiling=false",
            "--v=1",
            f"--audit-policy-file={self._audit_policy()}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-mode=blocking",
            "--audit-log-format=json",
            *self._feature_gate_flag(),
            *self.apiserver_args,
        ]
        if self.runtime_config:
            argv.append(f"--runtime-config={','.join(self.runtime_config)}")
        component = Component("kube-apiserver", argv, self.logs_dir / "kube-apiserver.log")
        self.components["kube-apiserver"] = component
        component.start()
        self._wait(component, timeout_s, self._apiserver_ready)

    def _audit_policy(self) -> Path:
        assert self.workdir is not None
        path = self.workdir / "audit-policy.yaml"
        path.write_text(yaml.safe_dump(AUDIT_POLICY))
        self.audit_log = self.workdir / "logs" / "audit.jsonl"
        return path

    def audit_mark(self) -> int:
        """A position in the audit log; :meth:`audited` after it reads only later requests."""
        return audit_mark(self.audit_log)

    def audited(self, since: int = 0, user: str | None = None) -> list[AuditedRequest]:
        """Requests by nodeagent's identities (not the harness, nor the control plane's own
        programs) since ``since`` (:meth:`audit_mark`), optionally of one ``user``.

        A watch counts when its response starts; everything else when its response completes.
        """
        return read_audit(self.audit_log, since, user)

    def _apiserver_ready(self) -> bool:
        try:
            self.request("GET", "/readyz", timeout_s=2)
        except (ControlPlaneError, OSError):
            return False
        return True

    def stop_apiserver(self) -> None:
        """Kill kube-apiserver (an outage: connections drop, nothing answers on its port).

        SIGKILL, as a crash would: a graceful stop waits for the open watches of the
        scheduler, the controller manager and Kueue to end (ten seconds here) and the store is
        in etcd either way.
        """
        self.components["kube-apiserver"].kill()

    def start_apiserver(self, timeout_s: float = 60.0) -> None:
        """Start kube-apiserver again on the same port, after :meth:`stop_apiserver`.

        A client that was still starting when the API server went away may have given up:
        kube-controller-manager exits when it cannot build its controllers. Any component that
        exited during the outage is started again, as a supervisor (the kubelet of a static
        pod, systemd) would restart it.
        """
        component = self.components["kube-apiserver"]
        component.start()
        self._wait(component, timeout_s, self._apiserver_ready)
        for name, other in self.components.items():
            exited = other.process is not None and other.process.poll() is not None
            if other is not component and exited:  # stopped on purpose: process is None
                log.warning("%s exited during the API server outage; starting it again", name)
                other.start()

    # kube-scheduler and kube-controller-manager

    def _start_kube_program(self, name: str) -> None:
        """Start kube-controller-manager or kube-scheduler as the only replica (no leader
        election), under its own identity (``system:<name>``), logging to ``<name>.log``."""
        kubeconfig = self._kubeconfig(name, f"system:{name}").path
        if name == "kube-scheduler":
            # Its secure port delegates authentication and authorization to the API server.
            own = [
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
            ]
        else:
            own = [
                f"--controllers={CONTROLLERS}",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={self.sa_keys.key}",
                f"--root-ca-file={self.ca.cert_path}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--secure-port=0",
            ]
        component = Component(
            name,
            [
                str(self.bin / name),
                f"--kubeconfig={kubeconfig}",
                "--leader-elect=false",
                *own,
                "--v=1",
                *self._feature_gate_flag(),
            ],
            self.logs_dir / f"{name}.log",
        )
        self.components[name] = component
        component.start()

    # Kueue

    def _start_kueue(self, timeout_s: float) -> None:
        assert self.workdir is not None
        # Kueue's kinds, and those of the integrations request templates check (JobSet, Ray,
        # the Kubeflow jobs, LeaderWorkerSet), so that tests can submit them; with those
        # integrations off, Kueue's no-op webhooks answer for them.
        crds = [
            *sorted(self.kueue_manifests.glob("kueue.x-k8s.io_*.yaml")),
            *sorted((self._bin_root / "integrations").glob("*.yaml")),
        ]
        for crd in crds:
            self.apply(crd)
        # The manager sets up indexes on its kinds at start: they must be served by then.
        self.kubectl(
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            *(f"crd/{plural}.{group}" for group, plural in (p.stem.split("_", 1) for p in crds)),
        )
        self.create_namespace("kueue-system")
        certs = self.workdir / "kueue-certs"
        certs.mkdir(exist_ok=True)
        pair = self.ca.issue("kueue-webhook")
        shutil.copy(pair.cert, certs / "tls.crt")
        shutil.copy(pair.key, certs / "tls.key")
        self.webhook_port = free_port()
        health_port, metrics_port = free_port(), free_port()
        config = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": "kueue-system",
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
            "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
            "webhook": {"port": self.webhook_port, "host": "127.0.0.1", "certDir": str(certs)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "manageJobsWithoutQueueName": False,
            "integrations": {"frameworks": ["batch/job", "pod"]},
            # The on-demand visibility API is an aggregated API server with its certificate at
            # a fixed path; nodeagent reads Workload objects instead.
            "featureGates": {"VisibilityOnDemand": False},
        }
        config_path = self.workdir / "kueue-config.yaml"
        config_path.write_text(yaml.safe_dump(config))
        env = dict(os.environ, KUBECONFIG=str(self.admin.path))
        component = Component(
            "kueue",
            [
                *self._kueue_metrics_cert(),
                str(self.bin / "kueue"),
                f"--config={config_path}",
                f"--kubeconfig={self.admin.path}",
            ],
            self.logs_dir / "kueue.log",
            env=env,
        )
        self.components["kueue"] = component
        component.start()
        self._wait(component, timeout_s, lambda: self._http_ok(health_port, "/readyz"))
        self.apply(self._kueue_webhooks())
        self._wait(component, timeout_s, self._kueue_webhooks_answer)

    def _kueue_metrics_cert(self) -> list[str]:
        """The command prefix that starts Kueue with its metrics certificate in place.

        Kueue (v0.17) reads its metrics serving certificate from a fixed path under /etc when
        its internal certificate management is off. Kueue runs in a private mount namespace
        whose /etc is an overlay of the machine's (on a tmpfs of that namespace): the pair from
        the harness CA goes there, and the machine's /etc is never written, so two runs at once
        cannot overwrite each other's pair.
        """
        assert self.workdir is not None
        pair = self.ca.issue("kueue-metrics")
        scratch = self.workdir / "kueue-etc"
        scratch.mkdir(exist_ok=True)
        return [
            "unshare",
            "--mount",
            "--propagation=private",
            "sh",
            "-c",
            _KUEUE_NAMESPACE_SCRIPT,
            "kueue-namespace",
            str(scratch),
            str(KUEUE_METRICS_CERTS),
            str(pair.cert),
            str(pair.key),
        ]

    def _kueue_webhooks(self) -> list[dict[str, Any]]:
        """Kueue's webhook configurations, pointed at the manager on loopback."""
        import base64

        ca_bundle = base64.b64encode(self.ca.cert_pem).decode()
        documents = []
        for doc in yaml.safe_load_all((self.kueue_manifests / "webhooks.yaml").read_text()):
            if not doc:
                continue
            doc["metadata"]["name"] = "kueue-" + doc["metadata"]["name"]
            for hook in doc.get("webhooks", []):
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {
                    "url": f"https://127.0.0.1:{self.webhook_port}{path}",
                    "caBundle": ca_bundle,
                }
            documents.append(doc)
        return documents

    def _kueue_webhooks_answer(self) -> bool:
        """Whether the API server can reach Kueue's webhooks (a dry-run create passes them)."""
        flavor = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": "harness-probe"},
        }
        try:
            self.request("POST", "/apis/kueue.x-k8s.io/v1beta2/resourceflavors?dryRun=All", flavor)
        except ControlPlaneError:
            return False
        return True

    @staticmethod
    def _http_ok(port: int, path: str) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    # helpers

    def _wait(self, component: Component, timeout_s: float, ready: Any) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ready():
                return
            if not component.running:
                raise ControlPlaneError(
                    f"{component.name} exited while starting; log {component.log_path}:\n"
                    f"{component.tail()}"
                )
            time.sleep(0.1)
        raise ControlPlaneError(
            f"{component.name} not ready after {timeout_s:.0f}s; log {component.log_path}:\n"
            f"{component.tail()}"
        )

    def keep_logs(self, destination: Path) -> Path:
        """Copy every component's log to ``destination`` (for a failed test); returns it."""
        destination.mkdir(parents=True, exist_ok=True)
        for path in self.logs_dir.glob("*.log"):
            shutil.copy(path, destination / path.name)
        return destination


@contextlib.contextmanager
def control_plane(**options: Any) -> Iterator[ControlPlane]:
    """``with control_plane(scheduler=True) as cp:`` -- started, and stopped at the end."""
    plane = ControlPlane(**options)
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()
