"""Installing the systemd units and a default config for this ``nodeagent``.

The unit files in the source tree's ``systemd/`` folder are written for the standard layout
(``/usr/local/bin/nodeagent``, ``/etc/nodeagent``, ``/var/lib/nodeagent``,
``/var/lib/kubelet``). Installing renders them for where this ``nodeagent`` actually lives and
for a root directory: ``/`` installs on the host; any other root installs a complete,
self-contained copy (units, config, state, kubelet directory all under that root) to rehearse a
layout or test the units without touching the host. ``nodeagent install-systemd`` is the command.
"""

from __future__ import annotations

import errno
import re
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

UNIT_FILES = ("nodeagent-mig.service", "nodeagent-mig-ready.target", "nodeagent.service")
CONFIG_FILE = "nodeagent.yaml"
# Earlier boot units read the MIG layout name from this file; the layout now lives only in the
# agent config, so an install that finds it says where its settings belong.
LEGACY_MIG_ENV = "mig.env"

# The paths the shipped files are written with, and what each becomes when rendered.
_STANDARD_BINARY = "/usr/local/bin/nodeagent"
_ROOTED_PREFIXES = ("/etc/nodeagent", "/var/lib/nodeagent", "/var/lib/kubelet")


@dataclass(frozen=True, slots=True)
class Layout:
    """Where one installation's files go and which paths the rendered files name."""

    root: Path  # "/" for the host, else a directory that stands in for it
    binary: Path  # the nodeagent executable ExecStart runs

    @property
    def unit_dir(self) -> Path:
        """Where unit files go (the administrator's unit directory)."""
        return self.path("/etc/systemd/system")

    @property
    def config_dir(self) -> Path:
        """The agent's configuration directory."""
        return self.path("/etc/nodeagent")

    @property
    def state_dir(self) -> Path:
        """The agent's state directory."""
        return self.path("/var/lib/nodeagent")

    def path(self, absolute: str) -> Path:
        """``absolute`` under this layout's root."""
        return self.root / absolute.lstrip("/")

    def render(self, text: str) -> str:
        """Rewrite the standard paths in a shipped file for this layout."""
        text = re.sub(
            rf"(?<![\w/.]){re.escape(_STANDARD_BINARY)}(?![\w/.-])", str(self.binary), text
        )
        if self.root == Path("/"):
            return text
        for prefix in _ROOTED_PREFIXES:
            # Only whole path components: /var/lib/kubelet, /var/lib/kubelet/device-plugins,
            # never /var/lib/kubelet-extra or a path already under the root.
            text = re.sub(
                rf"(?<![\w/.]){re.escape(prefix)}(?=[/\s:\"']|$)",
                str(self.path(prefix)),
                text,
                flags=re.MULTILINE,
            )
        return text


def default_prefix() -> Path:
    """The prefix whose ``bin/`` holds this installation's console scripts."""
    return Path(sysconfig.get_path("scripts")).parent


def find_source_dir() -> Path:
    """The folder holding the shipped unit files.

    A source checkout (editable install) has them at the repository root; a wheel installs
    them as data files under ``<prefix>/share/nodeagent/systemd``.
    """
    candidates = (
        Path(__file__).resolve().parents[1] / "systemd",
        Path(sys.prefix) / "share" / "nodeagent" / "systemd",
        default_prefix() / "share" / "nodeagent" / "systemd",
    )
    for candidate in candidates:
        if all((candidate / name).is_file() for name in (*UNIT_FILES, CONFIG_FILE)):
            return candidate
    searched = ", ".join(str(c) for c in candidates)
    raise FileNotFoundError(f"the systemd unit files are not installed (searched {searched})")


def simulate_dropin(layout: Layout, preset: str) -> str:
    """A drop-in that runs a unit against a simulated node kept in the state directory."""
    return (
        "# Rehearsal: run against a simulated node instead of the NVIDIA driver.\n"
        "# Remove this file (and `systemctl daemon-reload`) to use the real GPUs.\n"
        "[Service]\n"
        f"Environment=NODEAGENT_SIMULATE={preset}\n"
        f"Environment=NODEAGENT_SIM_STATE={layout.state_dir / 'sim'}\n"
    )


@dataclass(frozen=True, slots=True)
class InstallResult:
    """What one install wrote, and what it left alone."""

    written: tuple[Path, ...]
    kept: tuple[Path, ...]
    notes: tuple[str, ...] = ()  # things the operator should act on, one line each


def install(
    layout: Layout, source: Path | None = None, simulate: str | None = None
) -> InstallResult:
    """Render the units into ``layout`` and install the default config unless one exists.

    Units are always rewritten (they belong to the package; local changes go in drop-ins).
    The config file is the operator's: an existing one is kept byte for byte.
    """
    config = layout.config_dir / CONFIG_FILE
    if config.exists() and not config.is_file():
        # Checked before anything is written: reporting it as kept would leave the agent
        # without a config at its first start.
        raise IsADirectoryError(errno.EISDIR, "not a regular file", str(config))
    source = source or find_source_dir()
    written: list[Path] = []
    kept: list[Path] = []
    layout.unit_dir.mkdir(parents=True, exist_ok=True)
    for name in UNIT_FILES:
        target = layout.unit_dir / name
        target.write_text(layout.render((source / name).read_text()))
        written.append(target)
    for unit in ("nodeagent.service", "nodeagent-mig.service"):
        dropin = layout.unit_dir / f"{unit}.d" / "simulate.conf"
        if simulate:
            dropin.parent.mkdir(parents=True, exist_ok=True)
            dropin.write_text(simulate_dropin(layout, simulate))
            written.append(dropin)
        elif dropin.exists():
            # A real install over a rehearsal must not keep simulating.
            dropin.unlink()
    layout.config_dir.mkdir(parents=True, exist_ok=True)
    if config.exists():
        kept.append(config)
    else:
        config.write_text(layout.render((source / CONFIG_FILE).read_text()))
        config.chmod(0o640)
        written.append(config)
    layout.state_dir.mkdir(parents=True, exist_ok=True, mode=0o750)
    if layout.root != Path("/"):
        # A rehearsal root stands in for the kubelet's directory too; on a host the kubelet
        # owns it and the agent waits for it.
        layout.path("/var/lib/kubelet/device-plugins").mkdir(parents=True, exist_ok=True)
    notes = []
    legacy = layout.config_dir / LEGACY_MIG_ENV
    if legacy.exists():
        notes.append(
            f"{legacy} is no longer read: move NODEAGENT_MIG_CONFIG to pools.<pool>.mig_layout "
            f"and NODEAGENT_MIG_CONFIG_FILE to mig.layout_file in {config}, then delete it"
        )
    return InstallResult(tuple(written), tuple(kept), tuple(notes))
