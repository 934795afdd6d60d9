"""The container image's Dockerfile: hadolint, and the promises the docs make about it.

Docker cannot build images on the development and CI machines, so these checks read the file:
hadolint for the usual mistakes, and the parser below for what the DaemonSet and the docs rely
on (pinned base, the tested install command, a non-root default user, labels, health check).
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.deploy.tools import require_tool

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    result = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            word, _, rest = stripped.partition(" ")
            result.append((word.upper(), rest.strip()))
    return result


def test_hadolint_passes() -> None:
    hadolint = require_tool("hadolint")
    result = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_would_catch_a_regression(tmp_path: Path) -> None:
    # The check above can fail: an unpinned base image and a cached pip install are flagged.
    hadolint = require_tool("hadolint")
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install nodeagent\n")
    result = subprocess.run(
        [hadolint, "--no-color", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    assert "DL3007" in result.stdout


def _stages() -> list[tuple[str, str]]:
    """(image, stage name) of each FROM, build arguments filled in."""
    steps = instructions()
    args = dict(a.split("=", 1) for w, a in steps if w == "ARG" and "=" in a)
    stages = []
    for words in (a.split() for w, a in steps if w == "FROM"):
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], words[0])
        stages.append((image, words[-1] if len(words) == 3 else ""))
    return stages


def test_multi_stage_with_a_version_pinned_slim_base() -> None:
    stages = _stages()
    assert len(stages) >= 2, "build and runtime stages"
    python = [image for image, name in stages if name not in GO_STAGES]
    for image in python:
        assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+", image), image
    assert len(set(python)) == 1, "the library built for the image's Python runs on that Python"


# Go stages: the module whose go.mod names the Go they need.
GO_STAGES = {"nvml-header": "hack/nvidia/ctk/go.mod", "front": "device_plugin/front/go.mod"}


@pytest.mark.parametrize(("stage", "gomod_path"), GO_STAGES.items())
def test_the_go_stages_run_the_go_their_modules_ask_for(stage: str, gomod_path: str) -> None:
    (image,) = [image for image, name in _stages() if name == stage]
    found = re.fullmatch(r"golang:(\d+)\.(\d+)\.(\d+)-\w+", image)
    assert found, f"{image}: a pinned Go image"
    gomod = (REPO / gomod_path).read_text()
    wanted = re.search(r"^go (\d+)\.(\d+)(?:\.(\d+))?$", gomod, re.MULTILINE)
    assert wanted is not None
    have = tuple(int(x) for x in found.groups())
    assert have >= tuple(int(x or 0) for x in wanted.groups()), (image, wanted.group(0))


def test_the_image_carries_the_allocate_front_and_turns_it_on() -> None:
    steps = instructions()
    runs = " ".join(a for w, a in steps if w == "RUN")
    assert "bash device_plugin/front/build.sh" in runs  # built as `make device-plugin-front` does
    runtime = steps[max(i for i, (w, _) in enumerate(steps) if w == "FROM") :]
    copied = [a for w, a in runtime if w == "COPY" and "--from=front" in a]
    assert copied == ["--from=front /nodeagent-device-plugin-front /opt/nodeagent/bin/"]
    env = " ".join(a for w, a in runtime if w == "ENV")
    front = "/opt/nodeagent/bin/nodeagent-device-plugin-front"
    assert f"NODEAGENT_DEVICE_PLUGIN_ALLOCATE_FRONT={front}" in env


def test_the_image_carries_the_simulated_library_and_names_it() -> None:
    steps = instructions()
    runs = " ".join(a for w, a in steps if w == "RUN")
    # The pin has one owner: the header comes through hack/nvidia, as `make libnvml` gets it.
    assert "bash hack/nvidia/build.sh --nvml-header" in runs
    assert "-m nodeagent.sim.libnvml" in runs
    linked = re.search(r"ln -s \"[^\"]+\" (\S+/libnvidia-ml\.so\.1)", runs)
    assert linked is not None
    runtime = steps[max(i for i, (w, _) in enumerate(steps) if w == "FROM") :]
    env = " ".join(a for w, a in runtime if w == "ENV")
    assert f"NODEAGENT_LIBNVML={linked.group(1)}" in env
    assert linked.group(1).startswith("/opt/nodeagent/"), "inside what the runtime stage copies"
    assert ("COPY", "--from=build /opt/nodeagent /opt/nodeagent") in runtime
    # Never where a program's loader would take it for the driver's NVML.
    assert "LD_LIBRARY_PATH" not in env


def test_installs_with_the_tested_command() -> None:
    # The same `pip install .` from the source tree that `make` runs (there editable, with dev
    # extras), so the package the tests exercised is the package in the image.
    runs = " ".join(a for w, a in instructions() if w == "RUN")
    assert re.search(r"pip install --no-cache-dir \.(\s|$)", runs)
    # ...and the README's install command is that very step.
    readme = (REPO / "README.md").read_text()
    command = re.search(r"python3 -m venv (\S+) && (\S+)/bin/pip install --no-cache-dir \.", readme)
    assert command is not None, "README lost its install command"
    venv = command.group(1)
    assert f"-m venv {venv}" in runs
    assert f"{venv}/bin/pip install --no-cache-dir ." in runs
    copied = " ".join(a for w, a in instructions() if w == "COPY")
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {"nodeagent", *setuptools["package-dir"].values()}
    for folder in folders:
        assert f"{folder}/" in copied, f"{folder}/ is not copied into the build stage"


def test_runtime_user_labels_healthcheck_and_entrypoint() -> None:
    steps = instructions()
    runtime = steps[max(i for i, (w, _) in enumerate(steps) if w == "FROM") :]
    users = [a for w, a in runtime if w == "USER"]
    assert users, "the runtime stage sets a user"
    assert not users[-1].startswith(("root", "0")), "the default user is not root"
    labels = " ".join(a for w, a in runtime if w == "LABEL")
    for key in ("title", "description", "version", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert f"ARG VERSION={version}" in DOCKERFILE.read_text()
    (health,) = [a for w, a in runtime if w == "HEALTHCHECK"]
    assert "/healthz" in health
    assert "9475" in health
    assert ("ENTRYPOINT", '["nodeagent"]') in runtime


@pytest.mark.parametrize("overlay", ["plugin-exporter", "exporter-only"])
def test_daemonset_uses_this_image_version(overlay: str) -> None:
    from tests.deploy.tools import KUSTOMIZE_DIR, kustomize

    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    objects = kustomize(KUSTOMIZE_DIR / "overlays" / overlay)
    (daemonset,) = [o for o in objects if o["kind"] == "DaemonSet"]
    (c,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert c["image"] == f"nodeagent:{version}"
