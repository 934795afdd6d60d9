"""Build the simulated ``libnvidia-ml.so.1`` with gcc, cached by what goes into it.

Inputs: NVIDIA's ``nvml.h`` (never copied into this project: read from the go-nvml Go module
that ``hack/nvidia`` pins, or from ``NODEAGENT_NVML_HEADER``), the C core beside this file, the
entry points :mod:`~nodeagent.sim.libnvml.gen` writes, and the Python the library will start
when loaded into a program without one (its libpython, home and site directories, baked in).
The output directory, keyed by a hash of all of these, holds ``libnvidia-ml.so.1``, the
``libnvidia-ml.so`` link and the generated source. Where the library was built ahead of time
(the container image does it in its build stage, where the compiler and the header are),
``NODEAGENT_LIBNVML`` names it and nothing is built.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from nodeagent.sim.libnvml import bridge, gen

HERE = Path(__file__).resolve().parent
ENV_HEADER = "NODEAGENT_NVML_HEADER"
ENV_CACHE = "NODEAGENT_LIBNVML_CACHE"
ENV_LIBRARY = "NODEAGENT_LIBNVML"
SONAME = "libnvidia-ml.so.1"


class BuildError(Exception):
    """The library cannot be built here; the message says what is missing and how to fix it."""


def find_header() -> Path:
    """NVIDIA's ``nvml.h``: ``NODEAGENT_NVML_HEADER``, else go-nvml's via hack/nvidia."""
    named = os.environ.get(ENV_HEADER)
    if named:
        if not Path(named).is_file():
            raise BuildError(f"{ENV_HEADER}={named} is not a file; point it at NVIDIA's nvml.h")
        return Path(named)
    script = HERE.parents[2] / "hack" / "nvidia" / "build.sh"
    if not script.is_file():
        raise BuildError(
            f"no nvml.h: set {ENV_HEADER} to NVIDIA's nvml.h (go-nvml's pkg/nvml/nvml.h)"
        )
    done = subprocess.run(
        ["bash", str(script), "--nvml-header"], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["failed"])[-1]
        raise BuildError(f"cannot fetch nvml.h from the go-nvml module: {last}")
    return Path(done.stdout.strip().splitlines()[-1])


def _python() -> dict[str, str]:
    """Where the library finds Python when its host program has none."""
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    soname = sysconfig.get_config_var("INSTSONAME") or ""
    libpython = Path(libdir) / soname
    if not soname.endswith(tuple(f".so{s}" for s in ("", ".1.0"))) or not libpython.is_file():
        raise BuildError(
            f"{sys.executable} has no shared libpython ({libpython}); use a Python built with "
            "--enable-shared"
        )
    dirs = [*site.getsitepackages(), str(HERE.parents[2])]
    setup = (
        "import site, sys\n"
        f"for d in {dirs!r}:\n"
        "    if d not in sys.path:\n"
        "        site.addsitedir(d)\n"
    )
    return {
        "NVSIM_LIBPYTHON": str(libpython),
        "NVSIM_PYTHONHOME": sys.base_prefix,
        "NVSIM_SETUP": setup,
    }


def cache_root() -> Path:
    named = os.environ.get(ENV_CACHE)
    if named:
        return Path(named)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "nodeagent" / "libnvml"


def library() -> Path:
    """The simulated ``libnvidia-ml.so.1``: the one ``NODEAGENT_LIBNVML`` names, else built."""
    named = os.environ.get(ENV_LIBRARY)
    if named:
        if not Path(named).is_file():
            raise BuildError(
                f"{ENV_LIBRARY}={named} is not a file; point it at a built {SONAME} "
                f"(python -m nodeagent.sim.libnvml prints its folder) or unset it"
            )
        return Path(named)
    return build() / SONAME


def build(header: Path | None = None, root: Path | None = None) -> Path:
    """The directory holding ``libnvidia-ml.so.1``, built now unless already cached."""
    cc = os.environ.get("CC", "gcc")
    gcc = shutil.which(cc)
    if gcc is None:
        raise BuildError(f"no C compiler {cc!r}: install gcc (apt-get install gcc) or set CC")
    header = header or find_header()
    text = header.read_text(errors="replace")
    config = _python()
    entries = gen.source(text, bridge.simulated())
    digest = hashlib.sha256()
    for part in (
        text,
        entries,
        json.dumps(config, sort_keys=True),
        gcc,
        (HERE / "core.c").read_text(),
        (HERE / "nvsim.h").read_text(),
    ):
        digest.update(part.encode())
    out = (root or cache_root()) / f"libnvml-{digest.hexdigest()[:12]}"
    if (out / SONAME).is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=out.parent))
    try:
        (work / "entries.c").write_text(entries)
        (work / "nvsim_config.h").write_text(
            "".join(f"#define {k} {json.dumps(v)}\n" for k, v in config.items())
        )
        command = [
            gcc,
            "-shared",
            "-fPIC",
            "-O2",
            "-std=gnu11",
            "-Wall",
            "-Wno-unused-parameter",
            f"-I{header.parent}",
            f"-I{HERE}",
            f"-I{work}",
            str(HERE / "core.c"),
            str(work / "entries.c"),
            f"-Wl,-soname,{SONAME}",
            "-o",
            str(work / SONAME),
            "-ldl",
            "-lpthread",
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            first = next(
                (line for line in done.stderr.splitlines() if "error" in line), done.stderr
            )
            raise BuildError(f"gcc failed building {SONAME}: {first.strip()}")
        (work / "libnvidia-ml.so").symlink_to(SONAME)
        work.chmod(0o755)  # mkdtemp's 0700 would hide the library from other users
        try:
            work.rename(out)
        except OSError:  # another build finished first: its result is the same
            if not (out / SONAME).is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out
