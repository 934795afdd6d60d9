"""A real small file system that the test fills: a tmpfs in a private mount namespace.

The tmpfs is mounted by a helper process in its own mount namespace (``unshare --mount``), so
nothing on the host is mounted or left mounted; the test process reaches it through the helper's
root, ``/proc/<pid>/root/<mount point>``, with ordinary paths. The mount goes when the helper
ends. Mounting needs root: the tests skip without it, except in CI (``CI=true``), where a skip
would hide that the promise was never checked, so they fail.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

FILLER = ".filler"


def require_root() -> None:
    """Skip (fail in CI) unless this process may mount file systems."""
    if os.geteuid() == 0 and shutil.which("unshare"):
        return
    why = "a real full file system needs root and unshare(1) to mount a private tmpfs"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{why}; CI must run these tests as root")
    pytest.skip(why)


@dataclass(frozen=True)
class SmallDisk:
    """A mounted tmpfs of a few KiB; :attr:`path` is its root as this process sees it."""

    path: Path

    def fill(self) -> None:
        """Write until the file system answers ENOSPC (what a full disk does)."""
        with (self.path / FILLER).open("ab", buffering=0) as out:
            try:
                while True:
                    out.write(b"\0" * 4096)
                    os.fsync(out.fileno())
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise

    def free(self) -> None:
        """Remove what :meth:`fill` wrote."""
        (self.path / FILLER).unlink(missing_ok=True)

    def stray_files(self) -> list[str]:
        """Temporary files left behind anywhere on the disk (an atomic write's ``*.tmp``)."""
        return sorted(str(p) for p in self.path.rglob("*.tmp"))


@contextmanager
def small_disk(size_kib: int = 64) -> Iterator[SmallDisk]:
    """A tmpfs of ``size_kib`` KiB for the duration of the block (see the module doc)."""
    require_root()
    mount_point = Path(tempfile.mkdtemp(prefix="nodeagent-fulldisk-"))
    script = (
        'mount -t tmpfs -o "size=$1k,mode=0755" nodeagent-test "$2" && echo ready'
        " && exec sleep 3600"
    )
    helper = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
         str(size_kib), str(mount_point)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert helper.stdout is not None
        line = helper.stdout.readline().strip()
        if line != "ready":
            _, err = helper.communicate(timeout=5)
            raise RuntimeError(f"could not mount a test tmpfs: {err.strip() or line}")
        root = Path(f"/proc/{helper.pid}/root") / mount_point.relative_to("/")
        yield SmallDisk(root)
    finally:
        helper.kill()
        helper.wait(timeout=10)
        for stream in (helper.stdout, helper.stderr):
            if stream is not None:
                stream.close()
        mount_point.rmdir()  # the host's side was never mounted on: still the empty directory
