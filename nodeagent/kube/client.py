"""The project's one Kubernetes client builder: the agent and the tiering service both use it.

Where the credentials come from, first match wins (kubectl's order; docs/architecture.md,
"Reaching the API server"):

1. an explicit kubeconfig file (``--kubeconfig``, ``kubernetes.kubeconfig``);
2. ``$KUBECONFIG`` (a list of files, merged as kubectl merges them);
3. the pod's service account, when running in a pod (``in_cluster=True`` asks for it alone);
4. ``~/.kube/config``.

An API server URL given without a kubeconfig and without ``in_cluster`` is used as it is, with
no credentials (``kubectl proxy``, a test server); given with one of them it overrides the
server that one names.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import yaml
from kubernetes import client, config


class NoCredentialsError(Exception):
    """No source of credentials applies, or the one that does cannot be used (the message
    names what was looked for, or the file and what is wrong with it)."""


def configuration(
    *,
    server: str | None = None,
    kubeconfig: Path | None = None,
    in_cluster: bool = False,
    environ: Mapping[str, str] | None = None,
    home: Path | None = None,
) -> client.Configuration:
    """The client configuration from the first source that applies (see the module doc).

    ``environ`` and ``home`` default to the process's; tests pass their own.

    Raises:
        NoCredentialsError: none applies, or the chosen kubeconfig is unreadable or invalid.
    """
    env = os.environ if environ is None else environ
    cfg = client.Configuration()
    if server is not None and kubeconfig is None and not in_cluster:
        cfg.host = server
        return cfg
    default = (home if home is not None else Path.home()) / ".kube" / "config"
    if kubeconfig is not None:
        _load_kubeconfig(str(kubeconfig), cfg)
    elif not in_cluster and env.get("KUBECONFIG"):
        _load_kubeconfig(env["KUBECONFIG"], cfg)
    elif not _load_in_cluster(cfg, env):
        if in_cluster or not default.is_file():
            where = "not in a pod" if in_cluster else f"not in a pod, no $KUBECONFIG, no {default}"
            raise NoCredentialsError(f"no Kubernetes credentials: {where}")
        _load_kubeconfig(str(default), cfg)
    if server is not None:
        cfg.host = server
    return cfg


def api_client(
    *,
    server: str | None = None,
    kubeconfig: Path | None = None,
    in_cluster: bool = False,
    retries: int | None = None,
) -> client.ApiClient:
    """A ``kubernetes`` ApiClient over :func:`configuration`.

    ``retries``: the client's own connection retries (``0`` for a caller that retries with its
    own backoff and must not block inside one call; ``None``: the client's default).
    """
    cfg = configuration(server=server, kubeconfig=kubeconfig, in_cluster=in_cluster)
    if retries is not None:
        cfg.retries = retries
    return client.ApiClient(cfg)


def _load_kubeconfig(files: str, cfg: client.Configuration) -> None:
    # The client merges a colon-separated list as kubectl does for clusters, users and
    # contexts (the first file naming one wins) but takes the *last* current-context; kubectl
    # takes the first, so it is named here.
    try:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=files, context=_first_current_context(files), client_configuration=cfg
        )
    except config.ConfigException as exc:
        raise NoCredentialsError(f"kubeconfig {files} cannot be used: {exc}") from None
    except (OSError, ValueError, TypeError, AttributeError, KeyError, yaml.YAMLError) as exc:
        # The client reads any YAML as a kubeconfig; a file of another shape fails inside it.
        raise NoCredentialsError(
            f"kubeconfig {files} cannot be used: not a kubeconfig ({type(exc).__name__})"
        ) from None


def _first_current_context(files: str) -> str | None:
    for name in files.split(os.pathsep):
        try:
            data = yaml.safe_load(Path(name).read_text()) if name else None
        except (OSError, yaml.YAMLError):
            continue  # the client reports the file itself
        if isinstance(data, dict) and data.get("current-context"):
            return str(data["current-context"])
    return None


def _load_in_cluster(cfg: client.Configuration, env: Mapping[str, str]) -> bool:
    # The service account's token and CA are files the kubelet mounts; the address comes from
    # the environment every pod gets. Without the variable this is not a pod.
    if not env.get("KUBERNETES_SERVICE_HOST"):
        return False
    try:
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        return False
    return True
