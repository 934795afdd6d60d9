"""A simulated node's driver, as programs outside NVML find it: files, device nodes, ``/proc``.

``driver_root(DIR)`` lays out what NVIDIA's tools look for besides NVML: the driver's libraries
(``libnvidia-ml.so.<version>`` is the simulated library, ``libcuda.so.<version>`` a stand-in
that only has to exist), the character devices ``nvidia<minor>``, ``nvidiactl``,
``nvidia-uvm`` and ``nvidia-caps/nvidia-cap<N>`` (made with mknod: tools skip plain files), and
the ``/proc`` files of MIG (``driver/nvidia-caps/mig-minors``, the capability files of every
GPU and compute instance the node has now, and ``devices`` naming the majors used).
``enter`` (run inside ``unshare --mount``) puts them where programs look: a ``/dev`` holding the
host's entries plus the driver's nodes, and the ``/proc`` files bound over the real ones, in a
private mount namespace the host never sees.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from nodeagent.sim.libnvml import builder
from nodeagent.sim.state import StateStore

NVIDIA_MAJOR = 195  # fixed by the driver: nvidia<N>, nvidiactl (255), nvidia-modeset (254)
# The UVM and capability drivers get dynamic majors; these are free on common kernels and are
# named in the simulated /proc/devices, which is where tools look them up.
UVM_MAJOR, CAPS_MAJOR = 509, 508
GI_IDS, CI_IDS = 15, 8  # the MIG id spaces the driver lists in mig-minors, per GPU
ENV_DRIVER_ROOT = "NODEAGENT_SIM_DRIVER_ROOT"


class NodeError(Exception):
    """The driver root or the namespace cannot be made; the message names what is missing."""


def lib_dir(root: Path) -> Path:
    return root / "usr" / "lib" / (sysconfig.get_config_var("MULTIARCH") or "x86_64-linux-gnu")


def mig_minor(gpu: int, gi: int, ci: int | None = None) -> int:
    """The nvidia-caps minor of a GPU instance's (or compute instance's) access file.

    1 and 2 are MIG config and monitor; then, per GPU, each GI id's access file followed by its
    CI ids', the order the driver lists them in mig-minors.
    """
    per_gi = 1 + CI_IDS
    base = 3 + gpu * GI_IDS * per_gi + gi * per_gi
    return base if ci is None else base + 1 + ci


def _mknod(path: Path, major: int, minor: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mknod(path, 0o666 | 0o020000, os.makedev(major, minor))
        path.chmod(0o666)  # as the driver makes them; mknod applies the umask
    except PermissionError:
        raise NodeError(
            "making device nodes needs root (CAP_MKNOD); run as root, e.g. sudo nodeagent sim ..."
        ) from None


def _capability(path: Path, minor: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")


def _proc_devices() -> str:
    """The host's /proc/devices with the driver's majors added to the character devices."""
    try:
        host = Path("/proc/devices").read_text()
    except OSError:
        host = "Character devices:\n\nBlock devices:\n"
    ours = (
        f"{NVIDIA_MAJOR} nvidia-frontend\n{NVIDIA_MAJOR} nvidia\n{UVM_MAJOR} nvidia-uvm\n"
        f"{CAPS_MAJOR} nvidia-caps\n"
    )
    return host.replace("Character devices:\n", "Character devices:\n" + ours, 1)


def driver_root(root: Path, state_dir: Path, library: Path | None = None) -> Path:
    """Write the driver root for the node in ``state_dir`` into ``root``; returns ``root``."""
    state: dict[str, Any] = StateStore(state_dir).read()
    library = library or builder.library()
    version = str(state["driver_version"])
    libs = lib_dir(root)
    libs.mkdir(parents=True, exist_ok=True)
    for name in ("libnvidia-ml", "libcuda"):
        target = libs / f"{name}.so.{version}"
        shutil.copyfile(library, target)
        for link in (libs / f"{name}.so.1", libs / f"{name}.so"):
            link.unlink(missing_ok=True)
            link.symlink_to(target.name)
    dev = root / "dev"
    for gpu in state["gpus"]:
        _mknod(dev / f"nvidia{gpu['minor']}", NVIDIA_MAJOR, int(gpu["minor"]))
    _mknod(dev / "nvidiactl", NVIDIA_MAJOR, 255)
    _mknod(dev / "nvidia-modeset", NVIDIA_MAJOR, 254)
    _mknod(dev / "nvidia-uvm", UVM_MAJOR, 0)
    _mknod(dev / "nvidia-uvm-tools", UVM_MAJOR, 1)
    proc = root / "proc"
    caps = proc / "driver" / "nvidia" / "capabilities"
    lines = ["config 1", "monitor 2"]
    _capability(caps / "mig" / "config", 1)
    _capability(caps / "mig" / "monitor", 2)
    _mknod(dev / "nvidia-caps" / "nvidia-cap1", CAPS_MAJOR, 1)
    _mknod(dev / "nvidia-caps" / "nvidia-cap2", CAPS_MAJOR, 2)
    for gpu in state["gpus"]:
        minor = int(gpu["minor"])
        for gi_id in range(GI_IDS):
            lines.append(f"gpu{minor}/gi{gi_id}/access {mig_minor(minor, gi_id)}")
            lines += [
                f"gpu{minor}/gi{gi_id}/ci{ci}/access {mig_minor(minor, gi_id, ci)}"
                for ci in range(CI_IDS)
            ]
        for gi in gpu["instances"]:
            gi_dir = caps / f"gpu{minor}" / "mig" / f"gi{gi['id']}"
            _capability(gi_dir / "access", mig_minor(minor, gi["id"]))
            _mknod(
                dev / "nvidia-caps" / f"nvidia-cap{mig_minor(minor, gi['id'])}",
                CAPS_MAJOR,
                mig_minor(minor, gi["id"]),
            )
            for ci in gi["cis"]:
                number = mig_minor(minor, gi["id"], ci["id"])
                _capability(gi_dir / f"ci{ci['id']}" / "access", number)
                _mknod(dev / "nvidia-caps" / f"nvidia-cap{number}", CAPS_MAJOR, number)
    minors = proc / "driver" / "nvidia-caps" / "mig-minors"
    minors.parent.mkdir(parents=True, exist_ok=True)
    minors.write_text("\n".join(lines) + "\n")
    (proc / "devices").write_text(_proc_devices())
    return root


def check_rights() -> None:
    """NodeError naming what is missing for a private mount namespace."""
    if os.geteuid() != 0:
        raise NodeError(
            "a simulated driver needs root (a private mount namespace and device nodes); "
            "run as root, or leave out --driver to simulate only pynvml"
        )
    if shutil.which("unshare") is None:
        raise NodeError("unshare is not installed (util-linux); install it")


def run(command: list[str], state_dir: Path, env: dict[str, str]) -> int:
    """Run ``command`` on the node in ``state_dir`` with its simulated driver; its exit status."""
    check_rights()
    library = builder.library()
    with tempfile.TemporaryDirectory(prefix="nodeagent-driver-") as tmp:
        root = driver_root(Path(tmp), state_dir, library)
        env = {
            **env,
            ENV_DRIVER_ROOT: str(root),
            "LD_LIBRARY_PATH": os.pathsep.join(
                p for p in (str(lib_dir(root)), env.get("LD_LIBRARY_PATH", "")) if p
            ),
        }
        enter = [sys.executable, "-m", "nodeagent.sim.libnvml.node", str(root), "--", *command]
        unshare = ["unshare", "--mount", "--propagation", "private", *enter]
        # unshare and the enter step exec in place, so the child is the program itself: signals
        # sent to this process are passed on, and it dies with this process (PDEATHSIG), so that
        # stopping `nodeagent sim exec --driver` stops the program too.
        child = subprocess.Popen(unshare, env=env, preexec_fn=_die_with_parent)
        forwarded = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        previous = {
            sig: signal.signal(sig, lambda s, _f: child.send_signal(s)) for sig in forwarded
        }
        try:
            return child.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if child.poll() is None:
                child.kill()
                child.wait()


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent dies (prctl PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)


_MS_BIND, _MS_REC = 4096, 16384


def _bind(libc: Any, source: Path, target: Path) -> None:
    if libc.mount(str(source).encode(), str(target).encode(), None, _MS_BIND | _MS_REC, None):
        code = ctypes.get_errno()
        raise NodeError(f"cannot bind {source} on {target}: {os.strerror(code)}")


def enter(root: Path, command: list[str]) -> None:
    """Inside the private namespace: put the driver root in place, then exec ``command``."""
    libc = ctypes.CDLL(None, use_errno=True)
    dev = root / "dev"
    for entry in os.scandir("/dev"):
        target = dev / entry.name
        if target.exists() or target.is_symlink():
            continue  # the driver's own node
        if entry.is_symlink():
            target.symlink_to(os.readlink(entry.path))
        elif entry.is_dir(follow_symlinks=False):
            target.mkdir()
            _bind(libc, Path(entry.path), target)
        else:
            target.touch()
            try:
                _bind(libc, Path(entry.path), target)
            except NodeError:
                target.unlink()  # a node the kernel will not bind (rare) is left out
    _bind(libc, dev, Path("/dev"))
    _bind(libc, root / "proc" / "driver", Path("/proc/driver"))
    _bind(libc, root / "proc" / "devices", Path("/proc/devices"))
    try:
        os.execvp(command[0], command)  # noqa: S606 - the program the user named
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise NodeError(f"command not found: {command[0]}") from None
        raise


if __name__ == "__main__":
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.exit("usage: python -m nodeagent.sim.libnvml.node ROOT -- COMMAND ...")
    try:
        enter(Path(sys.argv[1]), sys.argv[3:])
    except NodeError as exc:
        print(f"nodeagent sim exec: {exc}", file=sys.stderr)
        sys.exit(2)
