"""``nodeagent sim``: manage a simulated node (presets, faults, processes).

Thin over :class:`nodeagent.sim.control.SimControl`. Every command works on the state directory
given by ``--state-dir`` / ``NODEAGENT_SIM_STATE`` and seeds an empty one from ``--simulate`` /
``NODEAGENT_SIMULATE``.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from nodeagent.cli.common import JsonOption, SimulateOption, StateDirOption, emit_json, fail
from nodeagent.cli.common import print_table as _print_table
from nodeagent.sim import sitedir
from nodeagent.sim.control import SimControl, SimError
from nodeagent.sim.nvml import ENV_SIM_TIME
from nodeagent.sim.ops import (
    FAULT_KINDS,
    NVLINK_ERROR_BURST,
    NVML_ERROR_CODE,
    NVML_ERROR_FUNCTION,
    PCIE_REPLAY_BURST,
)
from nodeagent.sim.presets import PRESETS
from nodeagent.sim.state import SimStateError, default_state_dir

app = typer.Typer(
    name="sim",
    help="Manage a simulated GPU node: presets, fault injection, fake processes.",
    no_args_is_help=True,
)
process_app = typer.Typer(help="Attach or detach fake compute processes.", no_args_is_help=True)
app.add_typer(process_app, name="process")

GpuOption = Annotated[int, typer.Option("--gpu", help="GPU index.", show_default=False)]
MigOption = Annotated[
    str | None,
    typer.Option("--mig", help="MIG device UUID (MIG-...) on that GPU.", show_default=False),
]


@contextmanager
def _sim_refusal_fails() -> Iterator[None]:
    """Exit 2 with the simulator's cause and hint when it refuses what a command asked for."""
    try:
        yield
    except SimError as exc:
        fail(str(exc), exc.hint)
    except SimStateError as exc:  # the state directory itself cannot be used
        fail(str(exc), "")


@contextmanager
def _driver_refusal_fails() -> Iterator[None]:
    """Exit 2 with one line when the simulated driver cannot be built or entered."""
    from nodeagent.sim.libnvml.builder import BuildError  # the C library's tooling, on demand
    from nodeagent.sim.libnvml.node import NodeError

    try:
        yield
    except BuildError as exc:
        fail(f"cannot build the simulated libnvidia-ml.so.1: {exc}", "see docs/simulator.md")
    except NodeError as exc:
        fail(str(exc), "see docs/simulator.md")


def _control(simulate: str | None, state_dir: Path | None) -> SimControl:
    return SimControl(state_dir or default_state_dir(), preset=simulate)


def _run_or_fail(simulate: str | None, state_dir: Path | None) -> SimControl:
    """A control object; exits 2 on a bad preset before anything else happens."""
    if simulate is not None and simulate not in PRESETS:
        fail(f"unknown preset {simulate!r}", f"choose one of: {', '.join(PRESETS)}")
    return _control(simulate, state_dir)


@app.command("presets")
def presets_cmd(json_out: JsonOption = False) -> None:
    """List the node presets."""
    rows = SimControl.presets()
    if json_out:
        emit_json([{"name": name, "description": text} for name, text in rows])
        return
    _print_table(["PRESET", "DESCRIPTION"], [[name, text] for name, text in rows])


@app.command("reset")
def reset_cmd(simulate: SimulateOption = None, state_dir: StateDirOption = None) -> None:
    """Recreate the simulated node from a preset (default: the node's current preset)."""
    control = _run_or_fail(simulate, state_dir)
    with _sim_refusal_fails():
        control.reset(simulate)
    state = control.store.read()
    gpus = len(state["gpus"])
    sys.stdout.write(
        f"simulated node {state['preset']} ({gpus} GPUs) in {control.store.state_dir}\n"
    )


@app.command("inject")
def inject_cmd(
    kind: Annotated[str, typer.Argument(help=f"Fault kind: {', '.join(FAULT_KINDS)}.")],
    gpu: GpuOption,
    mig: MigOption = None,
    code: Annotated[
        int | None,
        typer.Option(
            "--code",
            help="XID code (xid); link index (nvlink-down, nvlink-errors; default 0); NVML "
            f"return code (nvml-error; default {NVML_ERROR_CODE}, TIMEOUT).",
            show_default=False,
        ),
    ] = None,
    version: Annotated[
        str | None,
        typer.Option("--version", help="New driver version (driver).", show_default=False),
    ] = None,
    count: Annotated[
        int | None,
        typer.Option(
            "--count",
            help=f"Burst size: PCIe replays (pcie-replay; default {PCIE_REPLAY_BURST}), CRC "
            f"errors replayed on the link (nvlink-errors; default {NVLINK_ERROR_BURST}).",
            show_default=False,
        ),
    ] = None,
    function: Annotated[
        str | None,
        typer.Option(
            "--function",
            help="NVML function that fails on the GPU's handles (nvml-error; default "
            f"{NVML_ERROR_FUNCTION}).",
            show_default=False,
        ),
    ] = None,
    simulate: SimulateOption = None,
    state_dir: StateDirOption = None,
) -> None:
    """Inject a fault into one GPU."""
    details = [
        f"{name} {value}"
        for name, value in (
            ("code", code), ("version", version), ("count", count), ("function", function),
        )
        if value is not None
    ]  # fmt: skip
    target = f"MIG device {mig} of GPU {gpu}" if mig else f"GPU {gpu}"
    _change(
        simulate,
        state_dir,
        lambda c: c.inject(
            kind, gpu, mig_uuid=mig, code=code, version=version, count=count, function=function
        ),
        f"injected {kind}" + (f" ({', '.join(details)})" if details else "") + f" into {target}",
    )


def _change(
    simulate: str | None, state_dir: Path | None, change: Callable[[SimControl], object], what: str
) -> None:
    """Make one change to the simulated node and say what changed on which node.

    Silence would read as nothing done; a refusal exits 2 with the simulator's cause and hint.
    """
    control = _run_or_fail(simulate, state_dir)
    with _sim_refusal_fails():
        change(control)
    sys.stdout.write(f"{what} (simulated node in {control.store.state_dir})\n")


@app.command("clear")
def clear_cmd(
    gpu: GpuOption, simulate: SimulateOption = None, state_dir: StateDirOption = None
) -> None:
    """End a GPU's faults (cumulative counters such as ECC stay)."""
    _change(simulate, state_dir, lambda c: c.clear(gpu), f"cleared the faults of GPU {gpu}")


@app.command("reset-gpu")
def reset_gpu_cmd(
    gpu: GpuOption, simulate: SimulateOption = None, state_dir: StateDirOption = None
) -> None:
    """Reset one GPU as `nvidia-smi -r` does: apply a pending MIG mode, wipe its instances."""
    _change(simulate, state_dir, lambda c: c.reset_gpu(gpu), f"reset GPU {gpu}")


@process_app.command("add")
def process_add_cmd(
    gpu: GpuOption,
    mig: MigOption = None,
    memory_mib: Annotated[
        int, typer.Option("--memory-mib", help="GPU memory the process uses, in MiB.")
    ] = 1024,
    sm_share: Annotated[
        float | None,
        typer.Option(
            "--sm-share",
            help="Share of the GPU's time the process asks for (0..1); processes that ask for "
            "more than all of it share it in proportion. Default: 0.8 of a whole GPU or of its "
            "MIG slice.",
        ),
    ] = None,
    name: Annotated[
        str, typer.Option("--name", help="Command name NVML reports for the process.")
    ] = "python3",
    mps: Annotated[
        bool, typer.Option("--mps", help="An MPS client (listed by the MPS process query too).")
    ] = False,
    simulate: SimulateOption = None,
    state_dir: StateDirOption = None,
) -> None:
    """Attach a fake compute process; prints its PID."""
    control = _run_or_fail(simulate, state_dir)
    with _sim_refusal_fails():
        pid = control.add_process(
            gpu, mig_uuid=mig, used_memory_mib=memory_mib, load=sm_share, name=name, mps=mps
        )
    sys.stdout.write(f"{pid}\n")


@process_app.command("remove")
def process_remove_cmd(
    pid: Annotated[int, typer.Argument(help="PID printed by `process add`.")],
    simulate: SimulateOption = None,
    state_dir: StateDirOption = None,
) -> None:
    """Detach a fake compute process."""
    _change(simulate, state_dir, lambda c: c.remove_process(pid), f"removed process {pid}")


@app.command(
    "exec",
    context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
)
def exec_cmd(
    command: Annotated[
        list[str] | None,
        typer.Argument(help="The program and its arguments, after `--`.", show_default=False),
    ] = None,
    at_time: Annotated[
        float | None,
        typer.Option(
            "--at-time",
            envvar=ENV_SIM_TIME,
            help="Freeze the simulated telemetry at this Unix time, so that separate programs "
            "read the same values.",
            show_default=False,
        ),
    ] = None,
    driver: Annotated[
        bool,
        typer.Option(
            "--driver",
            help="Also give the program a simulated driver: libnvidia-ml.so.1 (for C, Go and "
            "Rust NVML clients), device nodes and the MIG /proc files, in a private mount "
            "namespace (needs root).",
        ),
    ] = False,
    simulate: SimulateOption = None,
    state_dir: StateDirOption = None,
) -> None:
    """Run a program with the simulated NVML standing in for its `pynvml` module.

    The program sees the same simulated node as every other command on this state directory,
    e.g. `nodeagent sim exec --simulate dgx-h100 -- gpustat --json`. With `--driver` any NVML
    program runs on it: `nodeagent sim exec --driver -- sh -c 'nvidia-ctk cdi generate
    --driver-root "$NODEAGENT_SIM_DRIVER_ROOT"'`.
    """
    if not command:
        fail("no command to run", "name it after `--`, e.g. nodeagent sim exec -- gpustat --json")
    control = _run_or_fail(simulate, state_dir)
    with _sim_refusal_fails():
        control.state()  # seed the node now: the program must find it there
    env = dict(os.environ)
    # Programs of nodeagent's own environment first: a `python` or a tool installed beside
    # nodeagent can import the simulator, another interpreter cannot.
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in (bin_dir, env.get("PATH", "")) if p)
    program = shutil.which(command[0], path=env["PATH"])
    if program is None:
        fail(f"command not found: {command[0]}", "check the name, or give its path")
    env["NODEAGENT_SIM_STATE"] = str(control.store.state_dir.resolve())
    if simulate:
        env["NODEAGENT_SIMULATE"] = simulate
    if at_time is not None:
        env[ENV_SIM_TIME] = repr(at_time)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(sitedir.PATH), env.get("PYTHONPATH", "")) if p
    )
    sys.stdout.flush()
    sys.stderr.flush()
    if driver:
        from nodeagent.sim.libnvml import node as libnvml_node

        with _driver_refusal_fails():
            raise typer.Exit(
                libnvml_node.run([program, *command[1:]], control.store.state_dir.resolve(), env)
            )
    # Replaced, not spawned: the program gets the terminal, the signals and the exit status.
    os.execve(program, [program, *command[1:]], env)  # noqa: S606 - a program the user named


@app.command("driver-root")
def driver_root_cmd(
    directory: Annotated[
        Path, typer.Argument(help="Where to write the driver root.", show_default=False)
    ],
    simulate: SimulateOption = None,
    state_dir: StateDirOption = None,
) -> None:
    """Write the simulated node's driver root: NVML and CUDA libraries, device nodes, /proc files.

    Point NVIDIA's tools at it (`nvidia-ctk cdi generate --driver-root DIR`). Device nodes need
    root; the MIG files describe the node as it is now.
    """
    control = _run_or_fail(simulate, state_dir)
    with _sim_refusal_fails():
        control.state()
    from nodeagent.sim.libnvml import node as libnvml_node

    with _driver_refusal_fails():
        try:
            libnvml_node.driver_root(directory, control.store.state_dir)
        except OSError as exc:  # where the driver root goes cannot hold it
            what = "a part of it is a file" if isinstance(exc, NotADirectoryError) else exc.strerror
            fail(f"cannot write {exc.filename}: {what}", "name a directory that can be written")
    sys.stdout.write(f"{directory}\n")
