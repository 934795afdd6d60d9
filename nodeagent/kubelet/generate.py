"""Regenerate the committed Python stubs of the kubelet APIs from their ``.proto`` files.

Run ``python -m nodeagent.kubelet.generate`` from the repository root after editing a proto.
``tests/kubelet/test_api_stubs.py`` regenerates into a temporary directory and fails on
any difference, so the committed stubs never drift from the protos.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from grpc_tools import protoc

REPO_ROOT = Path(__file__).resolve().parents[2]
PROTOS = (
    Path("nodeagent/kubelet/deviceplugin/v1beta1/api.proto"),
    Path("nodeagent/kubelet/podresources/v1/api.proto"),
    Path("nodeagent/kubelet/pluginregistration/v1/api.proto"),
    Path("nodeagent/kubelet/dra/v1/api.proto"),
    Path("nodeagent/kubelet/dra/v1beta1/api.proto"),
    Path("nodeagent/kubelet/drahealth/v1alpha1/api.proto"),
)
# What protoc writes for each proto (the .pyi files come from mypy-protobuf).
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def _plugin(name: str) -> str:
    """Path of a protoc plugin installed next to this Python (mypy-protobuf's executables)."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} not found; install mypy-protobuf (pip install mypy-protobuf)")
    return found


def outputs() -> list[Path]:
    """Every generated file, relative to the repository root."""
    return [p.with_name(p.stem + suffix) for p in PROTOS for suffix in SUFFIXES]


def generate(out_root: Path = REPO_ROOT) -> list[Path]:
    """Compile every proto into ``out_root`` (mirroring the repository layout); return the files.

    Protos are compiled with the repository root as the include path, so generated modules
    import each other as ``nodeagent.kubelet...``.
    """
    for proto in PROTOS:
        (out_root / proto.parent).mkdir(parents=True, exist_ok=True)
        args = [
            "grpc_tools.protoc",
            f"--proto_path={REPO_ROOT}",
            f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
            f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
            f"--python_out={out_root}",
            f"--grpc_python_out={out_root}",
            f"--mypy_out={out_root}",
            f"--mypy_grpc_out={out_root}",
            str(proto),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {proto}")
    return [out_root / path for path in outputs()]


if __name__ == "__main__":
    for written in generate():
        print(written.relative_to(REPO_ROOT))
