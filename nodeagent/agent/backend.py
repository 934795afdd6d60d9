"""Which NVML the program drives: the edge's one choice, made from ``--simulate`` or the env.

The GPU layer never reads the environment nor imports the simulator; the CLI and the agent call
:func:`open_node` once and pass the node on. With a preset (``--simulate PRESET`` or env
``NODEAGENT_SIMULATE``) the node is the simulator's, whose state lives in a directory shared by
every process on the same simulated node, and a GPU reset is the simulator's; without one it is
the real ``pynvml`` and ``nvidia-smi -r``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from nodeagent.gpu.errors import DriverNotLoaded, InvalidArgument
from nodeagent.gpu.node import GpuNode

ENV_SIMULATE = "NODEAGENT_SIMULATE"
ENV_SIM_STATE = "NODEAGENT_SIM_STATE"
ENV_MIG_LOCK = "NODEAGENT_MIG_LOCK_FILE"
# The node-wide MIG lock of a real node: a runtime path, so it goes with the boot (a lock is
# only meaningful among running processes) and every tool on the host finds the same one.
MIG_LOCK_FILE = Path("/run/nodeagent/mig.lock")
SIM_MIG_LOCK = "mig.lock"  # in the simulated node's state directory


def preset_names() -> Sequence[str]:
    """The simulator presets, for error hints and ``nodeagent sim presets``."""
    from nodeagent.sim.presets import preset_names as sim_preset_names

    return tuple(sim_preset_names())


def simulated_preset(
    simulate: str | None,
    environ: Mapping[str, str] | None = None,
    state_dir: Path | None = None,
) -> str | None:
    """The preset to simulate; None: real GPUs.

    ``simulate``, else env ``NODEAGENT_SIMULATE``, else the preset of the simulated node that
    the state directory holds (``state_dir``, else env ``NODEAGENT_SIM_STATE``): a state
    directory knows which node it simulates, so naming it is enough.

    Raises:
        InvalidArgument: the state directory holds a node file that cannot be read (the
            message names it and ``nodeagent sim reset``).
    """
    env = os.environ if environ is None else environ
    return simulate or env.get(ENV_SIMULATE) or held_preset(state_dir, env)


def held_preset(state_dir: Path | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The preset of the simulated node in ``state_dir`` (else env ``NODEAGENT_SIM_STATE``).

    None when neither is set or the directory holds no node. The default state directory
    (under the XDG state home) is never looked at: a node left there by an earlier try must
    not turn a real node's commands into simulated ones.
    """
    env = os.environ if environ is None else environ
    where = state_dir if state_dir is not None else Path(env.get(ENV_SIM_STATE) or "")
    if where == Path():
        return None
    from nodeagent.sim.state import STATE_FILE, SimStateError, StateStore

    if not (where / STATE_FILE).is_file():
        return None
    try:
        preset = StateStore(where).read().get("preset")
    except SimStateError as exc:
        raise InvalidArgument(str(exc)) from None
    return str(preset) if preset else None


def mig_lock_file(
    simulate: str | None,
    state_dir: Path | None,
    explicit: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> Path:
    """The node-wide MIG lock every MIG apply on the node takes (the CLI's and the agent's).

    ``explicit`` (``--mig-lock-file``), else env ``NODEAGENT_MIG_LOCK_FILE``, else the simulated
    node's state directory (a simulated node is its directory, so its lock lives there), else
    :data:`MIG_LOCK_FILE`.
    """
    env = os.environ if environ is None else environ
    if explicit is not None:
        return explicit
    if env.get(ENV_MIG_LOCK):
        return Path(env[ENV_MIG_LOCK])
    if simulated_preset(simulate, env, state_dir):
        from nodeagent.sim.state import default_state_dir

        return (state_dir or default_state_dir()) / SIM_MIG_LOCK
    return MIG_LOCK_FILE


def host_root(
    simulate: str | None, state_dir: Path | None, environ: Mapping[str, str] | None = None
) -> Path:
    """Where the host's own files (DMI product name, PCI classes) are read: ``/`` on a real
    node; the simulated node's ``host/`` folder, which its preset seeds, on a simulated one."""
    env = os.environ if environ is None else environ
    if simulated_preset(simulate, env, state_dir):
        from nodeagent.sim.presets import HOST_DIR
        from nodeagent.sim.state import default_state_dir

        return (state_dir or default_state_dir()) / HOST_DIR
    return Path("/")


def no_driver_message(cause: str) -> str:
    """One line naming the cause and the way to a simulated node."""
    try:
        presets = ", ".join(preset_names())
    except Exception:  # noqa: BLE001 - the hint must not hide the real error
        presets = "see `nodeagent sim presets`"
    return (
        f"no NVIDIA driver found ({cause}); to use a simulated node pass --simulate PRESET "
        f"or set {ENV_SIMULATE}=PRESET (presets: {presets})"
    )


def open_node(simulate: str | None = None, state_dir: Path | None = None) -> GpuNode:
    """Open the node's GPUs: the simulator when a preset is named, else real NVML.

    The simulator's state lives in ``state_dir`` (falls back to env ``NODEAGENT_SIM_STATE``,
    then the user's state directory); it is created from the preset when empty. Without a
    preset, a state directory that holds a simulated node opens that node.

    Raises:
        InvalidArgument: the preset is unknown (the message lists the presets), or the
            simulated node's state is corrupt (the message names ``nodeagent sim reset``).
        DriverNotLoaded: no driver and no preset (the message names ``--simulate``).
    """
    preset = simulated_preset(simulate, state_dir=state_dir)
    if preset:
        names = preset_names()
        if preset not in names:
            raise InvalidArgument(
                f"unknown simulator preset {preset!r}; choose one of: {', '.join(names)}"
            )
        from nodeagent.sim import SimNvml  # imported only when a preset is asked for
        from nodeagent.sim.control import reset_gpu
        from nodeagent.sim.state import SimStateError

        sim = SimNvml(state_dir, preset)
        try:
            # Seed or check the node here: the simulated NVML can only answer "no driver" to a
            # state it cannot read, which would send the operator after --simulate.
            sim.store.ensure(preset)
        except SimStateError as exc:
            raise InvalidArgument(str(exc)) from None
        return GpuNode(sim, reset=lambda index, _bus_id: reset_gpu(sim, index))
    try:
        import pynvml
    except ImportError as exc:
        raise DriverNotLoaded(no_driver_message(f"pynvml not importable: {exc}")) from exc
    try:
        return GpuNode(pynvml)
    except DriverNotLoaded as exc:
        raise DriverNotLoaded(
            no_driver_message(str(exc.__cause__ or exc)),
            function="nvmlInit",
            nvml_code=exc.nvml_code,
        ) from exc
