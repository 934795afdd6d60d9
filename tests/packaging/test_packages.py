"""The package list in pyproject.toml covers the tree, under the unique import names."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _setuptools() -> dict[str, object]:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    return data["tool"]["setuptools"]


def _import_name(folder: Path, mapping: dict[str, str]) -> str:
    top, *rest = folder.relative_to(REPO).parts
    inverse = {path: name for name, path in mapping.items()}
    return ".".join([inverse.get(top, top), *rest])


def test_every_package_folder_is_listed_under_its_import_name() -> None:
    setuptools = _setuptools()
    mapping = setuptools["package-dir"]
    assert isinstance(mapping, dict)
    roots = ["nodeagent", *mapping.values()]
    found = {
        _import_name(init.parent, mapping)
        for root in roots
        for init in (REPO / root).rglob("__init__.py")
    }
    assert set(setuptools["packages"]) == found  # type: ignore[arg-type]


def test_no_installed_name_is_a_bare_pypi_name() -> None:
    # `mig` and `exporters` are other projects on PyPI; installing beside them must not clash.
    for name in _setuptools()["packages"]:  # type: ignore[attr-defined]
        assert name.split(".")[0].startswith("nodeagent"), name
