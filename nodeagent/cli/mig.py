"""``nodeagent mig``: plan, apply, assert, show and export MIG layouts (mig-parted v1 files).

Thin over :mod:`nodeagent_mig.config`, :mod:`nodeagent_mig.planner` and :mod:`nodeagent_mig.apply`.

Which layout ``plan``, ``apply`` and ``assert`` work on: ``-c NAME`` when given, else the
``mig_layout`` of this node's pool in the agent config (``--agent-config``, env
``NODEAGENT_CONFIG``, the file ``nodeagent run`` reads). The layout file is ``-f``, else the
agent config's ``mig.layout_file``, else the built-in layouts. So the boot unit and the running
agent read the layout from one place.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from nodeagent.agent.backend import mig_lock_file, simulated_preset
from nodeagent.capacity import creatable, fragmentation_ratio, rank_order
from nodeagent.cli.common import (
    EXIT_DRIFT,
    EXIT_OK,
    JsonOption,
    MigLockOption,
    SimulateOption,
    StateDirOption,
    emit_json,
    fail,
    fail_config,
    finite,
    load_config_or_exit,
    open_node_or_exit,
    print_table,
)
from nodeagent.gpu.errors import GpuError, GpuLost
from nodeagent.gpu.types import MigSlot
from nodeagent.runtime.lock import LockHeldError, ProcessLock

if TYPE_CHECKING:
    from nodeagent.config.schema import AgentConfig
    from nodeagent.gpu.node import GpuNode
    from nodeagent.holds import Holds
    from nodeagent_mig.apply import ApplyReport, GpuReport, Prepared
    from nodeagent_mig.config import HooksFile, MigConfigFile

# The layout files, the planner and the applier are imported by the commands that use them:
# `mig show` needs none of them and must start fast (bench/cli_startup.py).

app = typer.Typer(
    help="MIG layouts in mig-parted's v1 format: plan, apply, assert, show, export.",
    no_args_is_help=True,
)

ConfigFileOption = Annotated[
    Path | None,
    typer.Option(
        "-f",
        "--config-file",
        envvar="NODEAGENT_MIG_CONFIG_FILE",
        help="Layout file (mig-parted v1). Default: the standard layouts shipped with nodeagent.",
        show_default=False,
    ),
]
ConfigNameOption = Annotated[
    str | None,
    typer.Option(
        "-c",
        "--config",
        envvar="NODEAGENT_MIG_CONFIG",
        help="Name of the layout in the file (a key of mig-configs). Default: the pool's "
        "mig_layout in the agent config.",
        show_default=False,
    ),
]
AgentConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--agent-config",
        envvar="NODEAGENT_CONFIG",
        help="Agent config (version: v1): without -c, its pool's mig_layout names the layout; "
        "without -f, its mig.layout_file is the file.",
        show_default=False,
    ),
]
MigStateDirOption = Annotated[
    Path | None,
    typer.Option(
        "--mig-state-dir",
        envvar="NODEAGENT_MIG_STATE_DIR",
        help="Where apply keeps its intent file for crash recovery (default: next to the "
        "simulator state, or /var/lib/nodeagent).",
        show_default=False,
    ),
]


AgentStateDirOption = Annotated[
    Path | None,
    typer.Option(
        "--agent-state-dir",
        help="The running agent's state directory, where its DRA checkpoint says which MIG "
        "instances prepared claims hold (default: as `nodeagent run` chooses it).",
        show_default=False,
    ),
]
PodResourcesOption = Annotated[
    Path | None,
    typer.Option(
        "--pod-resources-socket",
        help="The kubelet's pod-resources socket: which pods hold which devices (default: "
        "the agent config's metrics.pod_resources_socket, else the kubelet's own path).",
        show_default=False,
    ),
]
KubeletDirOption = Annotated[
    Path | None,
    typer.Option(
        "--kubelet-dir",
        help="The device-plugin directory, whose kubelet_internal_checkpoint is read where "
        "the pod-resources socket does not answer (default: the agent config's "
        "device_plugin.kubelet_dir).",
        show_default=False,
    ),
]


@dataclass(frozen=True, slots=True)
class _HoldPaths:
    """Where the workloads' holds are read: the options as given (None: the default)."""

    agent_state: Path | None = None
    pod_resources: Path | None = None
    kubelet_dir: Path | None = None


@dataclass(frozen=True, slots=True)
class _Choice:
    """The layout a command works on and where it came from."""

    cfg: MigConfigFile
    name: str | None  # None: the agent config leaves MIG alone (``skip`` says why)
    skip: str = ""
    agent: AgentConfig | None = None  # the agent config, when one was named


def _choose(
    file: Path | None, name: str | None, agent_path: Path | None, as_json: bool
) -> tuple[_Choice, str]:
    """The layout to work on and its name; exits 0 saying why when the pool leaves MIG alone
    (the boot unit runs on such a node too and must pass)."""
    choice = _resolve(file, name, agent_path)
    if choice.name is None:
        _nothing_to_do(choice, as_json)
    return choice, choice.name


def _resolve(file: Path | None, name: str | None, agent_path: Path | None) -> _Choice:
    """Resolve the layout: explicit ``-c``/``-f`` first, then the agent config's pool.

    Exits 2 when nothing names a layout, or when a named file is invalid.
    """
    from nodeagent.config.errors import ConfigError
    from nodeagent_mig.config import DEFAULT_CONFIG_FILE, load_config

    agent = load_config_or_exit(agent_path) if agent_path is not None else None
    if file is None and agent is not None:
        file = agent.mig.layout_file
    path = file or DEFAULT_CONFIG_FILE
    try:
        cfg = load_config(path)
    except ConfigError as exc:
        fail_config(exc, "fix the file; the format is mig-parted's v1 (see docs/mig.md)")
    if name:
        return _Choice(cfg, name, agent=agent)
    if agent is None:
        fail(
            "no MIG layout named: pass -c NAME, or set pools.<pool>.mig_layout in the agent "
            "config and pass it with --agent-config FILE (env NODEAGENT_CONFIG)",
            f"layouts in {path}: " + ", ".join(sorted(cfg.configs)),
        )
    where = f"in {agent_path}"
    if not agent.mig.enabled:
        # The agent does not manage MIG on this node, so neither does its boot unit.
        return _Choice(cfg, None, f"mig.enabled is false {where} (MIG is managed elsewhere)", agent)
    if agent.pool.mig_layout is None:
        return _Choice(
            cfg,
            None,
            f"pool {agent.node.pool!r} sets no mig_layout {where}, so MIG is left as it is",
            agent,
        )
    return _Choice(cfg, agent.pool.mig_layout, agent=agent)


def _nothing_to_do(choice: _Choice, as_json: bool) -> NoReturn:
    """Say why there is no layout to work on, and exit 0: the pool leaves MIG alone."""
    if as_json:
        emit_json({"config": None, "nothing_to_do": choice.skip})
    else:
        sys.stdout.write(f"nothing to do: {choice.skip}\n")
    raise typer.Exit(EXIT_OK)


def _mig_state_dir(
    explicit: Path | None, sim_state: Path | None, simulated: bool, agent: AgentConfig | None
) -> Path:
    """Where apply keeps its intent file.

    With an agent config this is the running agent's own ``<state dir>/mig`` (chosen as
    ``nodeagent run`` chooses it), so an apply interrupted here is finished by the agent and the
    other way round.
    """
    if explicit is not None:
        return explicit
    if agent is not None:
        if simulated and sim_state is not None:
            return sim_state / "agent" / "mig"
        return agent.state_dir / "mig"
    if simulated:
        base = sim_state or Path.home() / ".local" / "state" / "nodeagent"
        return base / "mig"
    return Path("/var/lib/nodeagent/mig")


def _holds(
    paths: _HoldPaths, sim_state: Path | None, simulated: bool, agent: AgentConfig | None
) -> Holds:
    """What workloads hold now: the running agent's DRA checkpoint, and the kubelet's
    allocations (pod-resources, else its checkpoint). Read under the MIG lock."""
    from nodeagent.config.device_plugin import DevicePluginSection
    from nodeagent.config.metrics import DEFAULT_POD_RESOURCES_SOCKET
    from nodeagent.config.schema import DEFAULT_STATE_DIR
    from nodeagent.holds import HoldSources

    state = paths.agent_state
    if state is None:
        # The agent's own state directory, chosen as `nodeagent run` chooses it.
        if simulated and sim_state is not None:
            state = sim_state / "agent"
        else:
            state = agent.state_dir if agent is not None else DEFAULT_STATE_DIR
    socket = paths.pod_resources or (
        agent.metrics.pod_resources_socket if agent is not None else DEFAULT_POD_RESOURCES_SOCKET
    )
    kubelet_dir = paths.kubelet_dir or (
        agent.device_plugin.kubelet_dir if agent is not None else DevicePluginSection().kubelet_dir
    )
    return HoldSources.of_agent(state, socket, kubelet_dir).read()


def _prepare_or_exit(
    node: GpuNode, cfg: MigConfigFile, name: str, force: bool, holds: Holds | None = None
) -> Prepared:
    from nodeagent.config.errors import ConfigError
    from nodeagent.holds import NO_HOLDS
    from nodeagent_mig.apply import prepare

    try:
        return prepare(node, cfg, name, force=force, holds=holds or NO_HOLDS)
    except ConfigError as exc:
        fail_config(exc, "nothing was changed; fix the layout for this node's GPUs")
    except GpuError as exc:
        fail(str(exc), "check the GPUs with `nodeagent mig show`")


def _lock_or_exit(path: Path, timeout_s: float) -> ProcessLock:
    """The node's MIG lock, waiting up to ``timeout_s``; exit 2 naming the holder."""
    lock = ProcessLock(path, "the node's MIG layout")
    try:
        lock.acquire(timeout_s)
    except LockHeldError as exc:
        fail(
            f"another MIG apply is running: {exc}; waited {timeout_s:g}s",
            "wait for it to finish (or pass a longer --lock-timeout); nothing was changed",
        )
    except OSError as exc:
        fail(
            f"cannot take the MIG lock {exc.filename}: {exc.strerror}",
            "run as root, or point --mig-lock-file (env NODEAGENT_MIG_LOCK_FILE) elsewhere",
        )
    return lock


# --- slice maps ------------------------------------------------------------------------------

CELL = 9  # characters per memory slice in a slice map


def slice_map(memory_slices: int, items: list[tuple[str, int, int, bool]]) -> list[str]:
    """Two lines: slice numbers, then instances drawn over the slices they occupy.

    ``items`` are (profile, start, size, busy). An idle instance is drawn ``[--name--]``, a
    busy one ``*--name--*``: the marker takes the place of the brackets rather than a character
    of the label, so it shows on every size, including a one-slice cell whose name already
    fills the space between the brackets.
    """
    header = "".join(f"{i:<{CELL}}" for i in range(memory_slices)).rstrip()
    row = []
    slot = 0
    for name, start, size, busy in sorted(items, key=lambda t: t[1]):
        while slot < start:
            row.append(f"{'.':<{CELL}}")
            slot += 1
        width = size * CELL
        left, right = ("*", "*") if busy else ("[", "]")
        row.append(left + name[: width - 2].center(width - 2, "-") + right)
        slot = start + size
    while slot < memory_slices:
        row.append(f"{'.':<{CELL}}")
        slot += 1
    return [header, "".join(row).rstrip()]


def _slots_to_items(slots: list[MigSlot]) -> list[tuple[str, int, int, bool]]:
    return [(s.profile, s.placement.start, s.placement.size, False) for s in slots]


# --- plan / apply ----------------------------------------------------------------------------


def _print_report(
    report: ApplyReport, slices: dict[int, int], before: dict[int, list[MigSlot]]
) -> None:
    rows = []
    for g in report.gpus:
        if g.lost:
            state = "LOST"
        elif report.dry_run:
            state = "would change" if g.changed and not g.errors else g.outcome
            state = "matches" if state == "unchanged" else state
        else:
            state = g.outcome
        rows.append(
            [
                str(g.index),
                g.model,
                state,
                str(len(g.kept)),
                str(len(g.destroyed) + len(g.half_made)),
                str(len(g.created)),
            ]
        )
    print_table(["GPU", "MODEL", "RESULT", "KEPT", "DESTROYED", "CREATED"], rows)
    for g in report.gpus:
        lines = []
        if g.mode_change:
            lines.append(f"  MIG mode: {g.mode_change}" + (" (GPU reset)" if g.reset else ""))
        lines += [f"  - destroy {d.label}" for d in g.destroyed]
        lines += [f"  - destroy {d.label} (half-made)" for d in g.half_made]
        lines += [f"  + create  {c.label}" for c in g.created]
        lines += [f"  ! {g.reset_required}"] if g.reset_required else []
        lines += [f"  ! {e}" for e in g.errors]
        lines += [f"  ! could not restore {s.label}" for s in g.unrestored]
        lines += [f"  ! --force took {t}" for t in g.taken]
        if not lines:
            continue
        sys.stdout.write(f"\nGPU {g.index} ({g.model})\n")
        sys.stdout.write("\n".join(lines) + "\n")
        if g.index in slices and (g.destroyed or g.half_made or g.created):
            for title, slots in (("before", before.get(g.index, [])), ("after", g.holds)):
                head, body = slice_map(slices[g.index], _slots_to_items(slots))
                sys.stdout.write(f"  {'':<7}{head}\n  {title:<7}{body}\n")
    if not report.dry_run:
        sys.stdout.write("\n" + "".join(f"{line}\n" for line in report.summaries()))
    else:
        for e in report.errors:
            sys.stdout.write(f"\n{e}\n")


@app.command()
def plan(
    file: ConfigFileOption = None,
    name: ConfigNameOption = None,
    force: Annotated[
        bool, typer.Option("--force", help="Allow destroying busy instances.")
    ] = False,
    agent_config: AgentConfigOption = None,
    simulate: SimulateOption = None,
    state_dir: StateDirOption = None,
    agent_state: AgentStateDirOption = None,
    pod_resources: PodResourcesOption = None,
    kubelet_dir: KubeletDirOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show what `apply` would do on each GPU: kept, destroyed, created, and the slice maps."""
    choice, name = _choose(file, name, agent_config, as_json)
    paths = _HoldPaths(agent_state, pod_resources, kubelet_dir)
    _plan(choice, name, force, simulate, state_dir, paths, as_json)


def _plan(
    choice: _Choice,
    name: str,
    force: bool,
    simulate: str | None,
    state_dir: Path | None,
    paths: _HoldPaths,
    as_json: bool,
) -> NoReturn:
    """``plan`` for a resolved layout (also ``apply --dry-run``)."""
    from nodeagent_mig.apply import dry_run

    node = open_node_or_exit(simulate, state_dir)
    simulated = simulated_preset(simulate, state_dir=state_dir) is not None
    holds = _holds(paths, state_dir, simulated, choice.agent)
    prepared = _prepare_or_exit(node, choice.cfg, name, force, holds)
    report = dry_run(prepared)
    before = _before(node, [w.index for w in prepared.work])
    if as_json:
        data = report.to_dict()
        for g in data["gpus"]:
            g["before"] = [slot.to_json() for slot in before.get(g["index"], [])]
        emit_json(data)
    else:
        _print_report(report, _slices(node, report.gpus), before)
    failing = any(g.errors for g in report.gpus)
    if failing:
        _say_why(report, partial=False)
    raise typer.Exit(EXIT_DRIFT if failing else EXIT_OK)


def _before(node: GpuNode, indices: list[int]) -> dict[int, list[MigSlot]]:
    out = {}
    for i in indices:
        try:
            on = node.info(i).mig_enabled
            out[i] = [g.slot for g in (node.mig_instances(i) if on else ())]
        except GpuLost:
            continue  # reported as lost; nothing to draw
    return out


def _slices(node: GpuNode, gpus: list[GpuReport]) -> dict[int, int]:
    out = {}
    for g in gpus:
        if g.lost:
            continue
        try:
            geometry = node.mig_geometry(g.index)
        except GpuLost:
            continue
        if geometry is not None:
            out[g.index] = geometry.memory_slices
    return out


@app.command()
def apply(
    file: ConfigFileOption = None,
    name: ConfigNameOption = None,
    dry: Annotated[bool, typer.Option("--dry-run", help="Show the plan; change nothing.")] = False,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Do not ask before destroying instances.")
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Destroy busy instances when the layout needs it.")
    ] = False,
    allow_reset: Annotated[
        bool,
        typer.Option(
            # No environment variable: NODEAGENT_MIG_ALLOW_RESET is the agent's mig.allow_reset,
            # and a shell that runs the agent must not make every `mig apply` reset GPUs.
            "--allow-reset",
            help="Reset idle GPUs whose MIG mode change is pending.",
        ),
    ] = False,
    partial: Annotated[
        bool | None,
        typer.Option(
            "--partial/--no-partial",
            help="Apply the other GPUs while a GPU blocked by a busy instance waits (default: "
            "the pool's mig_partial_apply in --agent-config, else off).",
            show_default=False,
        ),
    ] = None,
    lock_timeout: Annotated[
        float,
        typer.Option(
            "--lock-timeout",
            min=0.0,
            callback=finite,
            help="Seconds to wait for another MIG apply on this node to finish.",
        ),
    ] = 30.0,
    mig_lock: MigLockOption = None,
    hooks_file: Annotated[
        Path | None,
        typer.Option(
            "--hooks",
            "-k",
            envvar="NODEAGENT_MIG_HOOKS_FILE",
            help="Hooks file (mig-parted hooks v1).",
            show_default=False,
        ),
    ] = None,
    agent_config: AgentConfigOption = None,
    simulate: SimulateOption = None,
    state_dir: StateDirOption = None,
    mig_state: MigStateDirOption = None,
    agent_state: AgentStateDirOption = None,
    pod_resources: PodResourcesOption = None,
    kubelet_dir: KubeletDirOption = None,
    as_json: JsonOption = False,
) -> None:
    """Make the GPUs hold the layout, touching as few instances as possible.

    --force and --allow-reset are never taken from the agent config's mig.force and
    mig.allow_reset: those govern the running agent, which works next to live workloads,
    while a command line (or the boot unit) says for itself what it may destroy or reset.

    An instance a workload holds (a prepared DRA claim, a pod's device-plugin allocation) is
    busy like one with processes: the apply keeps it or refuses naming the claim or pod. With
    --force it is destroyed, and the claim is marked failed in the DRA checkpoint.
    """
    choice, name = _choose(file, name, agent_config, as_json)
    cfg = choice.cfg
    from nodeagent.config.errors import ConfigError
    from nodeagent_mig.config import load_hooks

    hooks: HooksFile | None = None
    if hooks_file is not None:
        try:
            hooks = load_hooks(hooks_file)
        except ConfigError as exc:
            fail_config(exc, "fix the hooks file (mig-parted hooks v1 shape, see docs/mig.md)")
    paths = _HoldPaths(agent_state, pod_resources, kubelet_dir)
    if dry:
        _plan(choice, name, force, simulate, state_dir, paths, as_json)
    if partial is None:
        partial = choice.agent.pool.mig_partial_apply if choice.agent is not None else False
    node = open_node_or_exit(simulate, state_dir)
    # One apply at a time on the node (the agent's reconciler takes the same lock), held from
    # the plan to the verification: a plan made while another apply runs is already stale.
    lock = _lock_or_exit(mig_lock_file(simulate, state_dir, mig_lock), lock_timeout)
    try:
        report, before = _apply_locked(
            node, cfg, name, choice, yes, force, allow_reset, partial, hooks, simulate, state_dir,
            mig_state, paths,
        )  # fmt: skip
    finally:
        lock.release()
    if as_json:
        emit_json(report.to_dict())
    else:
        if report.resumed_from:
            sys.stdout.write(f"note: resumed an interrupted apply of {report.resumed_from!r}\n")
        _print_report(report, _slices(node, report.gpus), before)
    if not report.ok:
        # The report went to stdout (or JSON); a caller that keeps only stderr (the boot unit's
        # journal, a test harness) must still learn why the apply did not hold.
        _say_why(report, partial=partial)
    raise typer.Exit(EXIT_OK if report.ok else EXIT_DRIFT)


def why_not_applied(report: ApplyReport, *, partial: bool) -> str:
    """One line: why the node does not hold the layout after ``report``, and what to do.

    The root cause comes first: a blocked GPU holds the others back, so it is named before
    them; a node-wide problem (a failing hook) is named when no GPU says more.
    """
    from nodeagent_mig.apply import BLOCKED_BUSY, FAILED, LOST, RESET_REQUIRED

    rank = {BLOCKED_BUSY: 0, LOST: 1, FAILED: 2, RESET_REQUIRED: 3}
    bad = sorted((g for g in report.gpus if g.outcome in rank), key=lambda g: rank[g.outcome])
    what = "would not apply" if report.dry_run else "did not apply"
    head = f"mig apply {what} layout {report.config!r}"
    if not bad:
        cause = report.errors[0] if report.errors else "the GPUs do not hold it"
        return f"{head}: {cause}; fix the cause (a hook's output is in the report) and run it again"
    first = bad[0]
    more = f" (and {len(bad) - 1} more GPU(s), see the report)" if len(bad) > 1 else ""
    cause = f"{head}: {first.summary()}{more}"
    if first.outcome == BLOCKED_BUSY:
        done = "the other GPUs were applied" if partial else "nothing was changed"
        others = "" if partial else "--partial to apply the other GPUs or "
        fix = (
            f"{done}; wait for the workload holding the instance to end, or pass {others}"
            "--force to destroy it (a DRA claim is then marked failed)"
        )
    elif first.outcome == LOST:
        fix = "the GPU does not answer: check it (nvidia-smi, XID 79) and reset or replace it"
    elif first.outcome == RESET_REQUIRED:
        fix = "pass --allow-reset to reset idle GPUs, or reboot the node, then run it again"
    else:
        fix = "see `nodeagent mig show` for what each GPU holds now, fix the cause, run it again"
    if report.dry_run:
        fix = "nothing was changed (a plan); " + fix.removeprefix("nothing was changed; ")
    return f"{cause}; {fix}"


def _say_why(report: ApplyReport, *, partial: bool) -> None:
    """Write :func:`why_not_applied` on stderr as one ``error:`` line."""
    sys.stderr.write(f"error: {why_not_applied(report, partial=partial)}\n")


def _apply_locked(
    node: GpuNode,
    cfg: MigConfigFile,
    name: str,
    choice: _Choice,
    yes: bool,
    force: bool,
    allow_reset: bool,
    partial: bool,
    hooks: HooksFile | None,
    simulate: str | None,
    state_dir: Path | None,
    mig_state: Path | None,
    paths: _HoldPaths,
) -> tuple[ApplyReport, dict[int, list[MigSlot]]]:
    """Plan, confirm and execute under the MIG lock; exits before any change when refused."""
    from nodeagent_mig.apply import execute

    simulated = simulated_preset(simulate, state_dir=state_dir) is not None
    # Read under the lock: the DRA plugin makes a claim's instances under it too.
    holds = _holds(paths, state_dir, simulated, choice.agent)
    prepared = _prepare_or_exit(node, cfg, name, force, holds)
    before = _before(node, [w.index for w in prepared.work])
    blocked = any(w.error is not None for w in prepared.work)
    if not yes and not (blocked and not partial):
        # Decide before changing anything: destroying instances needs the go-ahead, and so does
        # a MIG mode change without --allow-reset, which may leave GPUs pending a reset (a
        # half-made change); creating instances alone does not.
        modes = [] if allow_reset else prepared.mode_changes
        if modes or prepared.destroys:
            _confirm_or_exit(modes, prepared.destroys)
    state = _mig_state_dir(mig_state, state_dir, simulated, choice.agent)
    try:
        state.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(
            f"MIG state directory {state} cannot be created: {exc.strerror}; nothing was changed",
            "point --mig-state-dir (env NODEAGENT_MIG_STATE_DIR) at a writable directory",
        )
    try:
        report = execute(
            node,
            prepared,
            cfg,
            state_dir=state,
            force=force,
            allow_reset=allow_reset,
            partial=partial,
            hooks=hooks,
        )
    except GpuError as exc:
        fail(str(exc), "see `nodeagent mig show` for what each GPU holds now", EXIT_DRIFT)
    return report, before


def _confirm_or_exit(modes: list[str], doomed: list[str]) -> None:
    """Ask before a change that destroys instances or changes MIG modes; exit 2 on no."""
    what = []
    if doomed:
        what.append(f"destroys {len(doomed)} instance(s)")
    if modes:
        what.append(f"changes the MIG mode of {len(modes)} GPU(s) (a GPU reset may be needed)")
    items = modes + doomed
    if not sys.stdin.isatty():
        fail(
            f"the layout {' and '.join(what)}: "
            + ", ".join(items[:6])
            + (" ..." if len(items) > 6 else "")
            + "; nothing was changed",
            "pass --yes to go ahead, or --dry-run to see the plan",
        )
    sys.stdout.write("This " + " and ".join(what) + ":\n" + "".join(f"  {d}\n" for d in items))
    if not typer.confirm("Go ahead?", default=False):
        fail("cancelled; nothing was changed", "pass --yes to skip the question")


@app.command(name="assert")
def assert_(
    file: ConfigFileOption = None,
    name: ConfigNameOption = None,
    agent_config: AgentConfigOption = None,
    simulate: SimulateOption = None,
    state_dir: StateDirOption = None,
    as_json: JsonOption = False,
) -> None:
    """Exit 0 when the GPUs hold the layout, 1 listing the differences."""
    choice, name = _choose(file, name, agent_config, as_json)
    cfg = choice.cfg
    node = open_node_or_exit(simulate, state_dir)
    from nodeagent_mig.apply import differences

    prepared = _prepare_or_exit(node, cfg, name, False)
    diffs = differences(prepared)
    if as_json:
        emit_json(
            {
                "config": name,
                "matches": not diffs,
                "differences": diffs,
                "lost": sorted(prepared.lost),
            }
        )
    elif diffs:
        sys.stdout.write(f"layout {name!r} is not applied:\n" + "".join(f"  {d}\n" for d in diffs))
        differing = {d.split(":", 1)[0] for d in diffs}
        holding = [str(w.index) for w in prepared.work if f"GPU {w.index}" not in differing]
        if holding:
            sys.stdout.write(f"  (GPUs {','.join(holding)} hold it)\n")
    else:
        sys.stdout.write(
            f"layout {name!r} is applied on GPUs "
            + ",".join(str(w.index) for w in prepared.work)
            + "\n"
        )
    raise typer.Exit(EXIT_DRIFT if diffs else EXIT_OK)


# --- show / export ---------------------------------------------------------------------------


def _gpu_view(node: GpuNode, index: int) -> dict[str, Any]:
    info = node.info(index)
    geometry = node.mig_geometry(index)
    instances = node.mig_instances(index) if geometry is not None and info.mig_enabled else ()
    view: dict[str, Any] = {
        "index": index,
        "lost": False,
        "model": info.name,
        "mig_capable": geometry is not None,
        "mig_enabled": info.mig_enabled,
        "mig_pending": info.mig_pending,
        "instances": [
            {
                "profile": g.profile,
                "placement": {"start": g.placement.start, "size": g.placement.size},
                "uuid": g.uuid,
                "busy": g.busy,
                "instance_id": g.instance_id,
            }
            for g in instances
        ],
        "creatable": {},
        "fragmentation_ratio": 0.0,
    }
    if geometry is not None and info.mig_enabled:
        view["creatable"] = creatable(geometry, instances)
        view["fragmentation_ratio"] = round(fragmentation_ratio(geometry, instances), 4)
        view["memory_slices"] = geometry.memory_slices
        view["profiles"] = list(rank_order(geometry))
    return view


@app.command()
def show(
    simulate: SimulateOption = None,
    state_dir: StateDirOption = None,
    agent_state: AgentStateDirOption = None,
    as_json: JsonOption = False,
) -> None:
    """A slice map per GPU: instances over the memory slices, free slots, what still fits."""
    node = open_node_or_exit(simulate, state_dir)
    label = _label_state(agent_state, simulate, state_dir)
    views = []
    try:
        for i in range(node.count()):
            try:
                views.append(_gpu_view(node, i))
            except GpuLost as exc:
                # One GPU off the bus hides nothing of the others.
                views.append({"index": i, "lost": True, "error": str(exc)})
    except GpuError as exc:
        fail(str(exc), "check the GPUs with `nvidia-smi` (or the simulator state)")
    lost = [v for v in views if v["lost"]]
    if as_json:
        emit_json({"gpus": views, **({"mig_config_label": label} if label else {})})
        raise typer.Exit(EXIT_DRIFT if lost else EXIT_OK)
    if label:
        # The GPU Operator's protocol, as the agent last saw and applied it.
        line = f"{label.get('label')}={label.get('layout')}: {label.get('state')}"
        reason = label.get("reason")
        sys.stdout.write(line + (f": {reason}" if reason else "") + "\n\n")
    for v in views:
        if v["lost"]:
            sys.stdout.write(f"GPU {v['index']}  LOST  {v['error']}\n\n")
            continue
        mode = "MIG on" if v["mig_enabled"] else ("MIG off" if v["mig_capable"] else "no MIG")
        if v["mig_pending"] != v["mig_enabled"] and v["mig_capable"]:
            mode += f" (pending {'on' if v['mig_pending'] else 'off'}: reset required)"
        sys.stdout.write(f"GPU {v['index']}  {v['model']}  {mode}\n")
        if not v["mig_enabled"]:
            sys.stdout.write("\n")
            continue
        items = [
            (i["profile"], i["placement"]["start"], i["placement"]["size"], i["busy"])
            for i in v["instances"]
        ]
        head, body = slice_map(v["memory_slices"], items)
        sys.stdout.write(f"  {head}\n  {body}\n")
        taken = {s for _, st, sz, _ in items for s in range(st, st + sz)}
        free = [str(s) for s in range(v["memory_slices"]) if s not in taken]
        fits = [f"{p} x{v['creatable'][p]}" for p in v["profiles"] if v["creatable"][p]]
        sys.stdout.write(f"  free slices: {', '.join(free) or 'none'}\n")
        sys.stdout.write(f"  still fits:  {', '.join(fits) or 'nothing'}\n")
        sys.stdout.write(
            f"  fragmentation: {v['fragmentation_ratio']:.2f}"
            + ("   (*...* = busy)" if any(i[3] for i in items) else "")
            + "\n\n"
        )
    if lost:
        raise typer.Exit(EXIT_DRIFT)


def _label_state(
    explicit: Path | None, simulate: str | None, sim_state: Path | None
) -> dict[str, Any] | None:
    """What the running agent last did with the node's `nvidia.com/mig.config` label (its
    ``mig-config-label.json``), or None where it follows no label or the file is unreadable."""
    import json

    state = explicit
    if state is None:
        if sim_state is not None and simulated_preset(simulate, state_dir=sim_state) is not None:
            state = sim_state / "agent"
        else:
            from nodeagent.config.schema import DEFAULT_STATE_DIR

            state = DEFAULT_STATE_DIR
    try:
        data = json.loads((state / "mig-config-label.json").read_text())
    except (OSError, ValueError):
        return None  # no agent here, or none that follows the label: nothing to say
    if not isinstance(data, dict) or data.get("layout") is None:
        return None
    return data


@app.command()
def export(
    name: Annotated[
        str, typer.Option("-c", "--config", help="Name to give the exported layout.")
    ] = "current",
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="Write here instead of stdout.")
    ] = None,
    simulate: SimulateOption = None,
    state_dir: StateDirOption = None,
) -> None:
    """The current layout as a v1 file that `apply` accepts (applying it changes nothing)."""
    from nodeagent_mig.config import GpuTarget, parse_config, render_config

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        fail(
            f"-c {name!r} cannot name a layout",
            "use letters, digits, '.', '_' and '-', starting with a letter or digit",
        )
    node = open_node_or_exit(simulate, state_dir)
    targets = []
    lost: dict[int, str] = {}
    try:
        for i in range(node.count()):
            try:
                if node.mig_geometry(i) is None:
                    continue
                info = node.info(i)
                counts: dict[str, int] = {}
                for g in node.mig_instances(i) if info.mig_enabled else ():
                    counts[g.profile] = counts.get(g.profile, 0) + 1
            except GpuLost as exc:
                lost[i] = str(exc)
                continue
            targets.append(GpuTarget(i, info.mig_enabled, counts))
    except GpuError as exc:
        fail(str(exc), "check the GPUs with `nodeagent mig show`")
    if not targets:
        if lost:
            fail("every MIG-capable GPU is lost: " + "; ".join(lost.values()), "")
        fail("no MIG-capable GPU on this node", "MIG needs an A100, A30, H100, H200 or newer")
    text = render_config(name, targets)
    parse_config(text, "export")  # the export must always be a valid file
    if output is None:
        sys.stdout.write(text)
    else:
        from nodeagent.atomicfile import write_text_atomic

        try:
            # Through a rename: a file `apply` reads is never left half written.
            write_text_atomic(output, text)
        except OSError as exc:
            fail(
                f"cannot write {output}: {exc.strerror or exc}",
                "pass -o a file in an existing, writable directory, or omit -o for stdout",
            )
    for i, why in sorted(lost.items()):
        # The file lists the GPUs that answered; applying it leaves the lost one alone.
        sys.stderr.write(f"warning: GPU {i} left out of the export: {why}\n")
    if lost:
        raise typer.Exit(EXIT_DRIFT)
