"""What a plain install (no extras) can import: the whole product, and the test harness only
behind its own extra.

The dev extras are installed here, so a plain install is imitated: a child interpreter refuses
every module that only the extras bring in (their requirements, transitively, less what the
product's own dependencies bring in), then imports every module the wheel ships.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
# Runs `python -m` on import: never imported here (the kube one would start a control plane).
ENTRY_POINTS = re.compile(r"\.__main__$")
HARNESS = "nodeagent.testing.kube"  # the control-plane harness: behind the `testing` extra
# Developers' tools run from the source tree, with the dev extras, never by an operator: the
# module and the one dev-only package it needs.
DEV_TOOLS = {"nodeagent.kubelet.generate": "grpc_tools"}  # regenerates the checked-in stubs

CHILD = r"""
import importlib, importlib.abc, json, pkgutil, re, sys

refused, roots, skip = json.loads(sys.argv[1])


class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in refused:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Refuse())
failed = {}
for root in roots:
    package = importlib.import_module(root)
    names = [root] + [m.name for m in pkgutil.walk_packages(package.__path__, root + ".")
                      if not re.search(skip, m.name)]
    for name in names:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            failed[name] = exc.name.partition(".")[0]
print(json.dumps(failed))
"""


def _project() -> dict[str, object]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _closure(requirements: list[str]) -> set[str]:
    """The installed distributions ``requirements`` pull in, transitively (extras not taken)."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = req.name.lower().replace("_", "-")
        if name in seen or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            continue  # not installed here (a platform's optional part): nothing to refuse
        seen.add(name)
        todo.extend(Requirement(r) for r in dist.requires or ())
    return seen


def _modules(distributions: set[str]) -> set[str]:
    """The top-level import names those distributions install."""
    owners = metadata.packages_distributions()
    return {
        module
        for module, dists in owners.items()
        if any(d.lower().replace("_", "-") in distributions for d in dists)
    }


def _imports_refusing(refused: set[str]) -> dict[str, str]:
    project = _project()
    mapping = project["tool"]["setuptools"]["package-dir"]  # type: ignore[index]
    roots = ["nodeagent", *mapping]
    args = json.dumps([sorted(refused), roots, ENTRY_POINTS.pattern])
    out = subprocess.run(
        [sys.executable, "-c", CHILD, args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout.splitlines()[-1]))


def test_a_plain_install_imports_the_product_and_the_harness_needs_only_its_extra() -> None:
    project = _project()["project"]
    base = _closure(project["dependencies"])  # type: ignore[index]
    extras = project["optional-dependencies"]  # type: ignore[index]
    dev_only = _closure(extras["dev"]) - base
    testing_only = _closure(extras["testing"]) - base
    # The imitation is only as good as its list: it must refuse what the harness needs.
    assert {"pytest", "cryptography", "hypothesis"} <= _modules(dev_only)

    failed = _imports_refusing(_modules(dev_only))

    outside = {m: why for m, why in failed.items() if not m.startswith(HARNESS)}
    assert outside == DEV_TOOLS, "a module needs a dev extra; a plain install cannot import it"
    # The simulator and the helpers beside it are what operators run without the harness.
    assert failed.keys() - DEV_TOOLS.keys(), "the harness imported without its extra"
    harness = {why for m, why in failed.items() if m.startswith(HARNESS)}
    assert harness <= _modules(testing_only), (
        "the harness needs more than the `testing` extra installs"
    )


def test_the_harness_imports_with_its_extra_alone() -> None:
    project = _project()["project"]
    base = _closure(project["dependencies"])  # type: ignore[index]
    extras = project["optional-dependencies"]  # type: ignore[index]
    with_testing = base | _closure(extras["testing"])
    failed = _imports_refusing(_modules(_closure(extras["dev"]) - with_testing))
    assert failed == DEV_TOOLS


MAKE_CLUSTER = r"""
import importlib.abc, runpy, sys


class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "cryptography":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Refuse())
sys.argv = ["make cluster"]
runpy.run_module("nodeagent.testing.kube", run_name="__main__")
"""


def test_make_cluster_without_the_testing_extra_says_how_to_install_it() -> None:
    out = subprocess.run(
        [sys.executable, "-c", MAKE_CLUSTER],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr  # one line, no traceback
    assert "'cryptography'" in lines[0]
    assert "pip install 'nodeagent[testing]'" in lines[0]
