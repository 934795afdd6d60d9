"""The one Kubernetes client builder: kubectl's order of credentials, over real kubeconfig files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nodeagent.kube.client import NoCredentialsError, api_client, configuration


def kubeconfig(path: Path, server: str, token: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters: [{{name: c-{token}, cluster: {{server: "{server}"}}}}]
users: [{{name: u-{token}, user: {{token: {token}}}}}]
contexts: [{{name: x-{token}, context: {{cluster: c-{token}, user: u-{token}}}}}]
current-context: x-{token}
"""
    )
    return path


def token(cfg: Any) -> str:
    # What the client sends in the Authorization header ("" when it sends none).
    setting = cfg.auth_settings().get("BearerToken") or {}
    return str(setting.get("value") or "")


def test_an_explicit_kubeconfig_comes_before_kubeconfig_env_and_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    kubeconfig(home / ".kube" / "config", "https://home:6443", "home")
    env = {"KUBECONFIG": str(kubeconfig(tmp_path / "env.yaml", "https://env:6443", "env"))}
    given = kubeconfig(tmp_path / "given.yaml", "https://given:6443", "given")
    cfg = configuration(kubeconfig=given, environ=env, home=home)
    assert (cfg.host, token(cfg)) == ("https://given:6443", "Bearer given")


def test_kubeconfig_env_comes_before_home_and_merges_like_kubectl(tmp_path: Path) -> None:
    home = tmp_path / "home"
    kubeconfig(home / ".kube" / "config", "https://home:6443", "home")
    first = kubeconfig(tmp_path / "a.yaml", "https://a:6443", "a")
    second = kubeconfig(tmp_path / "b.yaml", "https://b:6443", "b")
    cfg = configuration(environ={"KUBECONFIG": f"{first}:{second}"}, home=home)
    # kubectl: the first file that sets current-context decides it.
    assert (cfg.host, token(cfg)) == ("https://a:6443", "Bearer a")


def test_home_is_the_last_resort_and_none_at_all_says_where_it_looked(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with pytest.raises(NoCredentialsError, match=r"not in a pod, no \$KUBECONFIG, no .*config"):
        configuration(environ={}, home=home)
    kubeconfig(home / ".kube" / "config", "https://home:6443", "home")
    cfg = configuration(environ={}, home=home)
    assert (cfg.host, token(cfg)) == ("https://home:6443", "Bearer home")


def test_a_server_alone_has_no_credentials_and_overrides_a_kubeconfig_server(
    tmp_path: Path,
) -> None:
    env = {"KUBECONFIG": str(kubeconfig(tmp_path / "env.yaml", "https://env:6443", "env"))}
    bare = configuration(server="http://127.0.0.1:8001", environ=env, home=tmp_path)
    assert (bare.host, token(bare)) == ("http://127.0.0.1:8001", "")
    given = kubeconfig(tmp_path / "given.yaml", "https://given:6443", "given")
    over = configuration(server="https://other:6443", kubeconfig=given, environ=env)
    assert (over.host, token(over)) == ("https://other:6443", "Bearer given")


def test_asking_for_in_cluster_outside_a_pod_fails_even_with_a_kubeconfig_around(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    kubeconfig(home / ".kube" / "config", "https://home:6443", "home")
    env = {"KUBECONFIG": str(kubeconfig(tmp_path / "env.yaml", "https://env:6443", "env"))}
    with pytest.raises(NoCredentialsError, match="not in a pod"):
        configuration(in_cluster=True, environ=env, home=home)


def test_the_client_carries_the_retries_asked_for(tmp_path: Path) -> None:
    given = kubeconfig(tmp_path / "given.yaml", "https://given:6443", "given")
    assert api_client(kubeconfig=given, retries=0).configuration.retries == 0


@pytest.mark.parametrize(
    ("content", "says"),
    [
        pytest.param(None, "cannot be used: Invalid kube-config file", id="missing"),
        pytest.param("garbage\n", "cannot be used: not a kubeconfig (TypeError)", id="a-word"),
        pytest.param("[1, 2]\n", "cannot be used: not a kubeconfig", id="a-list"),
        pytest.param("apiVersion: v1\nkind: Config\n", "cannot be used:", id="no-context"),
    ],
)
def test_a_kubeconfig_that_cannot_be_used_is_one_error_naming_it(
    tmp_path: Path, content: str | None, says: str
) -> None:
    path = tmp_path / "kubeconfig"
    if content is not None:
        path.write_text(content)
    with pytest.raises(NoCredentialsError) as caught:
        configuration(kubeconfig=path, environ={}, home=tmp_path)
    assert str(caught.value).startswith(f"kubeconfig {path} {says}"), str(caught.value)
    assert "\n" not in str(caught.value)
