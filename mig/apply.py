"""Apply a MIG layout to the node through :class:`nodeagent.gpu.protocols.MigDevices`, crash-safely.

Order of work (each numbered item is skipped when there is nothing to do):

1. resolve the layout against the node and plan every GPU (read-only; invalid input or a plan
   blocked by a busy instance stops here, before anything changes, unless the caller allows a
   *partial* apply: then the other GPUs go ahead and the blocked one waits; a lost GPU is
   reported and never stops the others);
2. write the *intent file* atomically (temp file, fsync, rename, fsync of the directory);
3. hooks ``apply-start``; then ``pre-apply-mode`` and the MIG mode changes: instances on GPUs
   being disabled are destroyed, the mode is requested, and a pending mode is made current by a
   reset only with ``allow_reset`` and no processes (else the GPU is reported "reset required");
4. ``pre-apply-config``; per GPU, new GPU instances are created first wherever free slices
   allow, and an instance the target drops is destroyed only when a new one needs its slices
   (or at the end); compute instances go before their GPU instance;
5. verify against the target; remove the intent file; ``apply-exit`` always runs.

Crash safety comes from planning against what the GPU holds *now*: after a crash at any step
the next run re-reads the GPUs, keeps every instance that already matches the target (including
ones the crashed run created), destroys the rest and creates what is missing, so nothing leaks
and nothing is created twice. A GPU instance left without compute instances (a crash between
the two destroy calls, or inside a create) is half-made and is always destroyed.

If a step fails, the GPU is rolled back: instances created by this run are destroyed and the
idle instances it destroyed are recreated at their old placements; the report says exactly
which it could not restore (``unrestored``) and what each GPU holds. Because destroys wait
until a creation needs their slices, a creation that keeps failing costs at most the instances
in the way of that one creation, never the whole GPU.

An instance is *busy* when processes run on it or a workload holds it: a prepared DRA claim
or a device-plugin allocation (:mod:`nodeagent.holds`, read by the caller under the MIG lock).
A plan that needs a busy instance's slices is refused with one line naming the processes'
instance and the claim or pod; with ``force`` it goes ahead, and every DRA claim whose instance
was destroyed is marked failed in the DRA checkpoint, every workload that lost one is logged
and listed in the report (``taken``). Where a source of holds exists but cannot be read, no
instance is destroyed without ``force``: what is free cannot be told.

Every GPU ends with one *outcome* (:data:`OUTCOMES`) and a one-line summary.

The caller holds the node's MIG lock (:mod:`nodeagent.runtime.lock`) around prepare and
execute: the intent file and the plan are only valid while no other apply runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TypedDict, Unpack

from nodeagent.atomicfile import write_json_atomic
from nodeagent.capacity import creatable, fragmentation_ratio
from nodeagent.gpu.errors import GpuError, GpuLost
from nodeagent.gpu.protocols import MigDevices
from nodeagent.gpu.types import GpuInstance, MigGeometry, MigSlot
from nodeagent.holds import NO_HOLDS, Holder, Holds
from nodeagent_mig.config import GpuFacts, GpuTarget, HooksFile, MigConfigFile, resolve
from nodeagent_mig.planner import GpuPlan, Instance, PlanError, plan_gpu

INTENT_FILE = "mig-intent.json"

# What happened to one GPU, worst last: the metric nodeagent_mig_apply_outcome and the report.
APPLIED = "applied"  # changed, and holds the target now
UNCHANGED = "unchanged"  # nothing was done (it holds the target, or the apply held it back)
RESET_REQUIRED = "reset-required"  # the MIG mode change waits for a GPU reset
BLOCKED_BUSY = "blocked-busy"  # the target needs the slices of a busy instance
FAILED = "failed"  # a step failed (rolled back as far as possible)
LOST = "lost"  # the GPU does not answer
OUTCOMES = (APPLIED, UNCHANGED, RESET_REQUIRED, BLOCKED_BUSY, FAILED, LOST)
_SUMMARY_CHARS = 300  # a summary line stays readable in a log and a metric label source

# Called right before each mutating NVML step with its number (1-based) and what it does: for
# progress reporting, and for the crash tests, which end the process at a chosen step.
StepHook = Callable[[int, str], None]


@dataclass
class GpuReport:
    """What happened (or, in a dry run, would happen) on one GPU."""

    index: int
    model: str
    mig_enabled: bool  # the mode in effect at the end
    target_enabled: bool
    kept: list[MigSlot] = field(default_factory=list)
    destroyed: list[MigSlot] = field(default_factory=list)
    half_made: list[MigSlot] = field(default_factory=list)  # destroyed: no compute instance
    created: list[MigSlot] = field(default_factory=list)
    mode_change: str | None = None  # "enable" / "disable" when requested
    reset_required: str | None = None  # why the mode change still waits for a reset
    reset: bool = False  # this apply reset the GPU to make a pending mode current
    errors: list[str] = field(default_factory=list)
    holds: list[MigSlot] = field(default_factory=list)  # the instances on the GPU at the end
    creatable: dict[str, int] = field(default_factory=dict)
    fragmentation: float = 0.0
    lost: bool = False  # the GPU did not answer; nothing else is known about it
    blocked: bool = False  # the target needs a busy instance's slices (see errors)
    held_back: str | None = None  # why the apply left this GPU alone (another GPU blocked)
    unrestored: list[MigSlot] = field(default_factory=list)  # destroyed, could not recreate
    taken: list[str] = field(default_factory=list)  # force destroyed what these workloads held

    @property
    def changed(self) -> bool:
        """Whether anything was (or would be) changed on this GPU."""
        return bool(self.destroyed or self.half_made or self.created or self.mode_change)

    @property
    def outcome(self) -> str:
        """One of :data:`OUTCOMES`."""
        if self.lost:
            return LOST
        if self.blocked:
            return BLOCKED_BUSY
        if self.errors:
            return FAILED
        if self.reset_required is not None:
            return RESET_REQUIRED
        return APPLIED if self.changed else UNCHANGED

    @property
    def reason(self) -> str:
        """Why the GPU does not hold the target, in one short sentence ("" when it does)."""
        if self.errors:
            return self.errors[0]
        return self.reset_required or self.held_back or ""

    def summary(self) -> str:
        """``GPU 3: applied: kept 2, destroyed 1, created 2`` (one line, bounded)."""
        counts = (
            f"kept {len(self.kept)}, destroyed {len(self.destroyed) + len(self.half_made)}, "
            f"created {len(self.created)}"
        )
        line = f"GPU {self.index}: {self.outcome}"
        if self.outcome in (APPLIED, FAILED):
            line += f": {counts}"
        if self.reason:
            line += f": {self.reason}"
        if self.unrestored:
            line += "; could not restore " + ", ".join(s.label for s in self.unrestored)
        return _bounded(line)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form: instances as ``{"profile", "start", "size"}``."""
        out = asdict(self)
        for key in ("kept", "destroyed", "half_made", "created", "holds", "unrestored"):
            out[key] = [slot.to_json() for slot in getattr(self, key)]
        out["outcome"] = self.outcome
        out["summary"] = self.summary()
        return out


def _bounded(text: str, limit: int = _SUMMARY_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class ApplyReport:
    """The outcome of one apply, per GPU."""

    config: str
    gpus: list[GpuReport]
    dry_run: bool = False
    resumed_from: str | None = None  # the layout an interrupted earlier apply was applying
    errors: list[str] = field(default_factory=list)  # node-wide problems (blocked, hooks)
    mutating_steps: int = 0

    @property
    def ok(self) -> bool:
        """No errors and every GPU applied or unchanged (none held back): the node holds it."""
        return not self.errors and all(
            g.outcome in (APPLIED, UNCHANGED) and g.held_back is None for g in self.gpus
        )

    def summaries(self) -> list[str]:
        """One line per GPU, then the node-wide problems."""
        return [g.summary() for g in self.gpus] + [_bounded(e) for e in self.errors]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form."""
        out = asdict(self)
        out["gpus"] = [g.to_dict() for g in self.gpus]
        out["ok"] = self.ok
        return out


@dataclass
class _GpuWork:
    """The prepared change for one GPU."""

    index: int
    model: str
    geometry: MigGeometry
    target: GpuTarget
    current: bool
    pending: bool
    before: tuple[Instance, ...]
    halfmade: tuple[Instance, ...]
    plan: GpuPlan | None  # None when the target is MIG off, or MIG must first come on
    error: str | None = None
    blocking: tuple[Instance, ...] = ()
    gpu_holders: tuple[Holder, ...] = ()  # workloads that hold the whole GPU (MIG off)

    @property
    def mode_change(self) -> bool:
        return self.target.mig_enabled != self.current


@dataclass
class Prepared:
    """A read-only preview of an apply: one entry per selected GPU."""

    config: str
    work: list[_GpuWork]
    lost: dict[int, str] = field(default_factory=dict)  # GPU index -> why it does not answer
    holds: Holds = NO_HOLDS  # what workloads held when the plan was made

    @property
    def mode_changes(self) -> list[str]:
        """Every GPU whose MIG mode the apply would change, as ``GPU n: enable``."""
        return [
            f"GPU {w.index}: {'enable' if w.target.mig_enabled else 'disable'} MIG"
            for w in self.work
            if w.mode_change or w.pending != w.target.mig_enabled
        ]

    @property
    def destroys(self) -> list[str]:
        """Every instance the apply would destroy, as ``GPU n: label``."""
        out = []
        for w in self.work:
            gone = list(w.halfmade)
            if w.plan is not None:
                gone += list(w.plan.destroy)
            elif not w.target.mig_enabled or w.mode_change:
                gone += list(w.before)
            out += [f"GPU {w.index}: {_busy_label(i)}" for i in gone]
        return out


def _busy_label(i: Instance) -> str:
    if i.holders:
        return i.busy_label
    return i.label + (" (busy)" if i.busy else "")


def _split(
    instances: Sequence[GpuInstance], holds: Holds
) -> tuple[tuple[Instance, ...], tuple[Instance, ...]]:
    """(whole instances, half-made ones without compute instances), with their holders."""
    whole = tuple(Instance.of(g, holds.of_instance(g)) for g in instances if g.compute_instances)
    half = tuple(Instance.of(g) for g in instances if not g.compute_instances)
    return whole, half


def _facts(node: MigDevices) -> tuple[list[GpuFacts], dict[int, str]]:
    """Facts about every GPU for :func:`resolve`, and the GPUs that do not answer.

    A lost GPU stays in the list (so "the node has GPUs 0-7" stays true) without geometry,
    which layout resolution treats as a GPU that is not part of a MIG layout.
    """
    facts, lost = [], {}
    for i in range(node.count()):
        try:
            info = node.info(i)
            facts.append(GpuFacts(i, info.name, info.pci_device_id, node.mig_geometry(i)))
        except GpuLost as exc:
            lost[i] = str(exc)
            facts.append(GpuFacts(i, "lost GPU", 0, None))
    return facts, lost


def _without(cfg: MigConfigFile, name: str, lost: Mapping[int, str]) -> MigConfigFile:
    """The layout with lost GPUs taken out of explicit ``devices`` lists (they are reported)."""
    if not lost or name not in cfg.configs:
        return cfg
    specs = tuple(
        spec
        if spec.devices is None
        else spec.model_copy(update={"devices": tuple(d for d in spec.devices if d not in lost)})
        for spec in cfg.configs[name]
    )
    return replace(cfg, configs={**cfg.configs, name: specs})


def prepare(
    node: MigDevices,
    cfg: MigConfigFile,
    name: str,
    *,
    force: bool = False,
    holds: Holds = NO_HOLDS,
) -> Prepared:
    """Resolve the layout and plan every selected GPU; changes nothing.

    A GPU that does not answer (lost) is listed in ``lost`` and left out of the plan. ``holds``:
    what workloads hold (read under the MIG lock); their instances are busy.

    Raises:
        ConfigError: the layout is invalid for this node (every problem listed).
    """
    facts, lost = _facts(node)
    targets = resolve(_without(cfg, name, lost), name, facts)
    work = []
    for index, target in sorted(targets.items()):
        try:
            info = node.info(index)
            geometry = node.mig_geometry(index)
            current = node.mig_instances(index) if info.mig_enabled else ()
        except GpuLost as exc:  # lost between the facts and now
            lost[index] = str(exc)
            continue
        assert geometry is not None  # resolve() only targets MIG-capable GPUs
        whole, half = _split(current, holds)
        w = _GpuWork(
            index,
            info.name,
            geometry,
            target,
            info.mig_enabled,
            info.mig_pending,
            whole,
            half,
            None,
        )
        try:
            if target.mig_enabled and info.mig_enabled:
                w.plan = plan_gpu(geometry, whole, target.devices, force=force)
            elif target.mig_enabled:
                w.gpu_holders = holds.of_gpu(index, info.uuid)
                if w.gpu_holders and not force:
                    raise PlanError(
                        f"enabling MIG takes GPU {index} from "
                        + ", ".join(h.label for h in w.gpu_holders)
                    )
                w.plan = plan_gpu(geometry, (), target.devices, force=force)
            elif not force and any(i.busy for i in whole):
                busy = tuple(i for i in whole if i.busy)
                raise PlanError(
                    "disabling MIG destroys busy instance(s) "
                    + ", ".join(_busy_label(i) for i in busy),
                    busy,
                )
            if holds.unknown is not None and not force and _destroys(w):
                raise PlanError(
                    f"cannot tell which workloads hold its instances ({holds.unknown}); "
                    "nothing is destroyed without force",
                    _destroyed(w),
                )
        except PlanError as exc:
            w.error = exc.reason
            w.blocking = exc.blocking
        work.append(w)
    return Prepared(name, work, lost, holds)


def _destroyed(w: _GpuWork) -> tuple[Instance, ...]:
    """The whole instances the prepared work would destroy."""
    if w.plan is not None:
        return w.plan.destroy
    return w.before if not w.target.mig_enabled else ()


def _destroys(w: _GpuWork) -> bool:
    return bool(_destroyed(w)) or (w.mode_change and w.target.mig_enabled)


# --- intent file ---------------------------------------------------------------------------------


def read_intent(state_dir: Path) -> dict[str, Any] | None:
    """The intent of an apply that did not finish, or ``None``."""
    try:
        data = json.loads((state_dir / INTENT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _intent(prepared: Prepared, cfg: MigConfigFile) -> dict[str, Any]:
    def layout(items: Sequence[MigSlot]) -> list[dict[str, Any]]:
        return [i.to_json() for i in items]

    return {
        "version": "v1",
        "config_file": cfg.path,
        "config": prepared.config,
        "pid": os.getpid(),
        "started_at": time.time(),
        "gpus": [
            {
                "index": w.index,
                "mig_enabled": w.target.mig_enabled,
                "before": layout([i.slot for i in w.before]),
                "after": layout(w.plan.layout_after()) if w.plan else [],
            }
            for w in prepared.work
        ],
    }


# --- hooks ---------------------------------------------------------------------------------------


def _run_hooks(hooks: HooksFile | None, name: str, env: Mapping[str, str]) -> str | None:
    """Run the commands of one hook in order; the first failure is returned as text."""
    if hooks is None:
        return None
    for hook in hooks.hooks.get(name, ()):
        full_env = {**os.environ, **env, **hook.envs}
        try:
            result = subprocess.run(
                [hook.command, *hook.args],
                env=full_env,
                cwd=hook.workdir or None,
                capture_output=True,
                text=True,
                check=False,
            )
        except OSError as exc:
            return f"hook {name}: cannot run {hook.command}: {exc.strerror}"
        if result.returncode != 0:
            tail = " ".join((result.stderr or result.stdout).split())[-200:]
            return f"hook {name}: {hook.command} exited {result.returncode}: {tail}"
    return None


# --- execution -------------------------------------------------------------------------------


class _Steps:
    """Counts mutating calls and calls the step hook before each."""

    def __init__(self, on_step: StepHook | None) -> None:
        self.count = 0
        self.on_step = on_step

    def __call__(self, what: str) -> None:
        self.count += 1
        if self.on_step is not None:
            self.on_step(self.count, what)


def _destroy(node: MigDevices, index: int, gi: GpuInstance, step: _Steps) -> None:
    """Compute instances first, then the GPU instance (NVML refuses the GI while CIs exist)."""
    for ci in gi.compute_instances:
        step(f"GPU {index}: destroy compute instance {ci.instance_id} of GI {gi.instance_id}")
        node.destroy_compute_instance(index, gi.instance_id, ci.instance_id)
    step(f"GPU {index}: destroy GPU instance {gi.instance_id} ({gi.profile})")
    node.destroy_gpu_instance(index, gi.instance_id)


def _find(node: MigDevices, index: int, item: MigSlot) -> GpuInstance | None:
    for gi in node.mig_instances(index):
        if gi.profile == item.profile and gi.placement == item.placement:
            return gi
    return None


def _finish_report(node: MigDevices, w: _GpuWork, r: GpuReport, *, verify: bool = True) -> None:
    """Fill in what the GPU holds now and its capacity; ``verify``: check it against the target."""
    try:
        info = node.info(w.index)
        r.mig_enabled = info.mig_enabled
        now = node.mig_instances(w.index) if info.mig_enabled else ()
    except GpuLost as exc:
        r.lost = True
        r.errors.append(str(exc))
        return
    except GpuError as exc:
        r.errors.append(f"cannot read the GPU back: {exc}")
        return
    r.holds = [g.slot for g in now]
    if info.mig_enabled:
        r.creatable = creatable(w.geometry, now)
        r.fragmentation = fragmentation_ratio(w.geometry, now)
    if verify and r.reset_required is None and not r.errors:
        want = Counter(w.target.devices) if w.target.mig_enabled else Counter()
        have = Counter(g.profile for g in now if g.compute_instances)
        if info.mig_enabled != w.target.mig_enabled or want != have:
            r.errors.append(
                "verification failed: GPU holds "
                + (", ".join(s.label for s in r.holds) or "nothing")
                + f" with MIG {'on' if info.mig_enabled else 'off'}"
            )


def _lost_report(index: int, why: str) -> GpuReport:
    return GpuReport(index, "unknown", False, False, errors=[why], lost=True)


def _rollback(
    node: MigDevices,
    index: int,
    r: GpuReport,
    created: list[MigSlot],
    destroyed: list[Instance],
    step: _Steps,
) -> str:
    """Undo this run's changes on one GPU as far as possible; returns what was done.

    The instances this run created go first (they are in the slices of what it destroyed, and
    nothing runs on them yet), then the idle instances it destroyed are recreated at their old
    placements. What cannot be recreated is listed in ``r.unrestored``.
    """
    notes = []
    for item in reversed(created):
        gi = _find(node, index, item)
        if gi is not None:
            try:
                _destroy(node, index, gi, step)
                notes.append(f"removed {item.label}")
            except GpuError as exc:
                notes.append(f"could not remove {item.label}: {exc}")
    restored = []
    for old in destroyed:
        if old.busy:
            continue  # destroyed only with force: its work is gone whatever we recreate
        try:
            step(f"GPU {index}: recreate {old.label}")
            node.create_gpu_instance(index, old.profile, old.placement)
            restored.append(old.label)
        except GpuError:
            r.unrestored.append(old.slot)
    if restored:
        notes.append("restored " + ", ".join(restored))
    if r.unrestored:
        notes.append("could not restore " + ", ".join(s.label for s in r.unrestored))
    return "; ".join(notes) or "nothing to undo"


def _taken(holds: Holds, r: GpuReport, what: str, holders: Sequence[Holder]) -> None:
    """Force destroyed ``what``, which ``holders`` held: mark their claims failed, say so."""
    if not holders:
        return
    why = f"nodeagent mig apply --force destroyed {what} on GPU {r.index}"
    for line in holds.mark_failed(holders, why):
        r.taken.append(f"{what}: {line}")


def _apply_mode(
    node: MigDevices,
    w: _GpuWork,
    r: GpuReport,
    allow_reset: bool,
    force: bool,
    step: _Steps,
    holds: Holds,
) -> bool:
    """Bring the GPU's MIG mode to the target; True when it is in effect now."""
    index = w.index
    if not w.target.mig_enabled:
        for gi in node.mig_instances(index) if w.current else ():
            item = Instance.of(gi, holds.of_instance(gi))
            if item.busy and not force:
                r.errors.append(f"{_busy_label(item)} is busy; not destroyed (use force)")
                return False
            _destroy(node, index, gi, step)
            r.destroyed.append(gi.slot)
            _taken(holds, r, item.label, item.holders)
    r.mode_change = "enable" if w.target.mig_enabled else "disable"
    # Requested even when it is pending already: the driver switches a GPU that has gone idle
    # since (nvml.h: "idle the device and retry setting the mode"), so no reset is needed.
    step(f"GPU {index}: set MIG mode {r.mode_change}")
    change = node.set_mig_mode(index, w.target.mig_enabled)
    if not change.reset_required and change.current == w.target.mig_enabled:
        return True
    reason = change.reason
    if allow_reset:
        procs = [p for p in node.telemetry(index).processes]
        if procs:
            pids = ", ".join(str(p.pid) for p in procs)
            r.reset_required = f"reset required: processes {pids} run on the GPU; stop them"
            return False
        # A reset destroys every instance on the GPU: one a workload holds blocks it as
        # processes do (a mode change left pending earlier can meet instances made since).
        info = node.info(index)
        now = node.mig_instances(index) if info.mig_enabled else ()
        held = [h for gi in now for h in holds.of_instance(gi)]
        held += holds.of_gpu(index, info.uuid)
        if held and not force:
            r.reset_required = (
                "reset required: it would take the GPU from "
                + ", ".join(h.label for h in dict.fromkeys(held))
                + "; rerun with --force to go ahead"
            )
            return False
        step(f"GPU {index}: reset")
        node.reset_gpu(index)
        r.reset = True
        _taken(holds, r, f"GPU {index} (reset)", held)
        return node.info(index).mig_enabled == w.target.mig_enabled
    r.reset_required = (
        "reset required: "
        + (reason or "the new MIG mode takes effect after a GPU reset")
        + "; rerun with --allow-reset when the GPU is idle"
    )
    return False


def _in_the_way(
    new: MigSlot,
    pending: list[Instance],
    present: list[MigSlot],
    geometry: MigGeometry,
) -> list[Instance]:
    """The instances the target drops that must go before ``new`` can be created.

    Those overlapping its placement, and, when its profile is at the model's instance limit,
    one of the same profile that the target drops.
    """
    victims = [d for d in pending if d.placement.overlaps(new.placement)]
    profile = geometry.profile(new.profile)
    same = sum(1 for s in present if s.profile == new.profile) - sum(
        1 for d in victims if d.profile == new.profile
    )
    if profile is not None and same >= profile.max_count:
        victims += [d for d in pending if d.profile == new.profile and d not in victims][:1]
    return victims


def _apply_layout(
    node: MigDevices, w: _GpuWork, r: GpuReport, force: bool, step: _Steps, holds: Holds
) -> None:
    """Create and destroy instances on one GPU (MIG is on), rolling back on failure.

    New instances are created first wherever the free slices allow; an instance the target
    drops is destroyed only when the next creation needs its slices, and the rest at the end.
    """
    index = w.index
    now = node.mig_instances(index)
    whole, half = _split(now, holds)
    # The plan prepared before anything changed still holds when the GPU has what it had then
    # (or nothing, after the mode change this apply made). Only a GPU that changed under the
    # apply (another tool, between the preview and the go-ahead) is planned again.
    expected = w.before if not w.mode_change else ()
    plan = w.plan
    if plan is None or set(whole) != set(expected):
        plan = plan_gpu(w.geometry, whole, w.target.devices, force=force)
    r.kept = [i.slot for i in plan.keep]
    created: list[MigSlot] = []
    destroyed: list[Instance] = []
    by_id = {g.instance_id: g for g in now}
    pending_destroy = list(plan.destroy)
    pending_create = list(plan.create)
    present = [i.slot for i in (*plan.keep, *plan.destroy)]

    def blocked_by(new: MigSlot) -> list[Instance]:
        return _in_the_way(new, pending_destroy, present, w.geometry)

    def destroy(item: Instance) -> None:
        assert item.instance_id is not None
        _destroy(node, index, by_id[item.instance_id], step)
        pending_destroy.remove(item)
        present.remove(item.slot)
        destroyed.append(item)
        r.destroyed.append(item.slot)
        _taken(holds, r, item.label, item.holders)

    try:
        # Half-made instances (no compute instance) hold no work and block their slices.
        for item in half:
            gi = by_id[item.instance_id] if item.instance_id is not None else None
            if gi is not None:
                _destroy(node, index, gi, step)
                r.half_made.append(item.slot)
        while pending_create:
            free = (n for n in pending_create if not blocked_by(n))
            new = next(free, None)
            if new is None:
                # Nothing fits yet: clear the way for the first creation only, so a creation
                # that then fails costs no more than the instances in its way.
                new = pending_create[0]
                for victim in blocked_by(new):
                    destroy(victim)
            step(f"GPU {index}: create {new.label}")
            node.create_gpu_instance(index, new.profile, new.placement)
            pending_create.remove(new)
            present.append(new)
            created.append(new)
            r.created.append(new)
        for item in list(pending_destroy):
            destroy(item)
    except GpuError as exc:
        undo = _rollback(node, index, r, created, destroyed, step)
        r.errors.append(f"{exc} (rolled back: {undo})")


class ExecuteOptions(TypedDict, total=False):
    """The switches of :func:`execute` and :func:`reconcile`; each is off when left out."""

    force: bool  # destroy busy instances
    allow_reset: bool  # reset a GPU whose MIG mode change waits for one
    partial: bool  # apply the other GPUs while one is blocked
    hooks: HooksFile | None
    on_step: StepHook | None


def execute(
    node: MigDevices,
    prepared: Prepared,
    cfg: MigConfigFile,
    *,
    state_dir: Path,
    **options: Unpack[ExecuteOptions],
) -> ApplyReport:
    """Carry out a prepared apply. See the module docstring for the order and the guarantees.

    ``partial``: a GPU blocked by a busy instance waits while the other GPUs are applied;
    without it a blocked GPU stops the whole apply before anything changes.
    """
    earlier = read_intent(state_dir)
    report = ApplyReport(
        prepared.config,
        [GpuReport(w.index, w.model, w.current, w.target.mig_enabled) for w in prepared.work],
        resumed_from=str(earlier.get("config")) if earlier else None,
    )
    reports = {r.index: r for r in report.gpus}
    blocked = [w for w in prepared.work if w.error is not None]
    for w in blocked:
        r = reports[w.index]
        r.errors.append(w.error or "")
        r.blocked = bool(w.blocking or w.gpu_holders)
    try:
        if blocked and not options.get("partial", False):
            where = ", ".join(f"GPU {w.index}" for w in blocked)
            for w in prepared.work:
                if w.error is None:
                    reports[w.index].held_back = f"not applied: {where} blocked"
                _finish_report(node, w, reports[w.index], verify=False)
            report.errors.append(
                f"nothing was changed: {where} blocked; the other GPUs are applied only when "
                "the pool allows a partial apply (mig_partial_apply)"
            )
            return report
        _execute(node, prepared, cfg, report, state_dir, options)
        return report
    finally:
        for index, why in sorted(prepared.lost.items()):
            report.gpus.append(_lost_report(index, why))
        report.gpus.sort(key=lambda g: g.index)


def _execute(
    node: MigDevices,
    prepared: Prepared,
    cfg: MigConfigFile,
    report: ApplyReport,
    state_dir: Path,
    options: ExecuteOptions,
) -> None:
    force = options.get("force", False)
    allow_reset = options.get("allow_reset", False)
    hooks = options.get("hooks")
    reports = {r.index: r for r in report.gpus}
    work = [w for w in prepared.work if w.error is None]
    for w in prepared.work:
        if w.error is not None:
            _finish_report(node, w, reports[w.index], verify=False)
    todo = [
        w
        for w in work
        if w.mode_change
        or w.halfmade
        or (w.plan is not None and not w.plan.is_noop)
        or w.pending != w.target.mig_enabled
    ]
    if not todo:
        for w in work:
            reports[w.index].kept = [i.slot for i in w.before]
            _finish_report(node, w, reports[w.index])
        (state_dir / INTENT_FILE).unlink(missing_ok=True)  # an earlier crash left it converged
        return

    write_json_atomic(state_dir / INTENT_FILE, _intent(prepared, cfg))
    env = {
        "NODEAGENT_MIG_CONFIG_FILE": cfg.path,
        "NODEAGENT_MIG_CONFIG": prepared.config,
        "MIG_PARTED_CONFIG_FILE": cfg.path,
        "MIG_PARTED_SELECTED_CONFIG": prepared.config,
    }
    step = _Steps(options.get("on_step"))
    try:
        failure = _run_hooks(hooks, "apply-start", env)
        modes = [w for w in todo if w.mode_change or w.pending != w.target.mig_enabled]
        if failure is None and modes:
            failure = _run_hooks(hooks, "pre-apply-mode", env)
        ready: dict[int, bool] = {w.index: w.current for w in todo}
        if failure is None:
            for w in modes:
                r = reports[w.index]
                try:
                    ready[w.index] = _apply_mode(
                        node, w, r, allow_reset, force, step, prepared.holds
                    )
                    if ready[w.index] and w.target.mig_enabled and not r.reset:
                        # Only with force (prepare refused it otherwise), and only once MIG is
                        # on: a change still pending leaves the whole GPU to its holders (a
                        # reset said so already).
                        _taken(prepared.holds, r, f"GPU {w.index}", w.gpu_holders)
                except GpuLost as exc:
                    r.lost = True
                    r.errors.append(str(exc))
                    ready[w.index] = False
                except GpuError as exc:
                    r.errors.append(str(exc))
                    ready[w.index] = False
            failure = _run_hooks(hooks, "pre-apply-config", env)
        if failure is None:
            for w in todo:
                if w.target.mig_enabled and ready[w.index]:
                    try:
                        _apply_layout(node, w, reports[w.index], force, step, prepared.holds)
                    except GpuLost as exc:
                        reports[w.index].lost = True
                        reports[w.index].errors.append(str(exc))
                    except GpuError as exc:
                        reports[w.index].errors.append(str(exc))
                    except PlanError as exc:
                        reports[w.index].errors.append(exc.reason)
        if failure is not None:
            report.errors.append(failure)
    finally:
        exit_failure = _run_hooks(hooks, "apply-exit", env)
        if exit_failure is not None:
            report.errors.append(exit_failure)
    report.mutating_steps = step.count
    for w in work:
        r = reports[w.index]
        if not r.changed and not r.kept and w.plan is not None:
            r.kept = [i.slot for i in w.plan.keep]
        if not r.lost:
            _finish_report(node, w, r)
    (state_dir / INTENT_FILE).unlink(missing_ok=True)


def reconcile(
    node: MigDevices,
    cfg: MigConfigFile,
    name: str,
    *,
    state_dir: Path,
    holds: Holds = NO_HOLDS,
    **options: Unpack[ExecuteOptions],
) -> ApplyReport:
    """Make the node hold layout ``name`` of ``cfg``: the one entry point the agent calls.

    Busy instances (processes, or held by a workload in ``holds``) are never destroyed unless
    ``force``; a GPU whose MIG mode change waits for a reset is reported, and reset only with
    ``allow_reset`` when no process runs on it. The caller holds the node's MIG lock.

    Raises:
        ConfigError: the layout is invalid for this node; nothing was changed.
    """
    prepared = prepare(node, cfg, name, force=options.get("force", False), holds=holds)
    return execute(node, prepared, cfg, state_dir=state_dir, **options)


def dry_run(prepared: Prepared) -> ApplyReport:
    """What :func:`execute` would do with ``prepared``, without changing anything."""
    report = ApplyReport(prepared.config, [], dry_run=True)
    for w in prepared.work:
        r = GpuReport(w.index, w.model, w.current, w.target.mig_enabled)
        if w.error is not None:
            r.errors.append(w.error)
            r.blocked = bool(w.blocking or w.gpu_holders)
        if w.mode_change:
            r.mode_change = "enable" if w.target.mig_enabled else "disable"
            if not w.target.mig_enabled:
                r.destroyed = [i.slot for i in w.before]
        r.half_made = [i.slot for i in w.halfmade]
        if w.plan is not None:
            if not w.mode_change:
                r.kept = [i.slot for i in w.plan.keep]
                r.destroyed += [i.slot for i in w.plan.destroy]
            r.created = list(w.plan.create)
            r.holds = list(w.plan.layout_after())
            r.creatable = dict(w.plan.creatable_after)
            r.fragmentation = w.plan.fragmentation_after
        report.gpus.append(r)
    report.gpus += [_lost_report(i, why) for i, why in prepared.lost.items()]
    report.gpus.sort(key=lambda g: g.index)
    return report


def differences(prepared: Prepared) -> list[str]:
    """How the node differs from the prepared layout (``mig assert``); empty when it holds it."""
    diffs: list[str] = [f"GPU {i}: lost ({why})" for i, why in sorted(prepared.lost.items())]
    for w in prepared.work:
        if w.current != w.target.mig_enabled:
            diffs.append(
                f"GPU {w.index}: MIG is {'on' if w.current else 'off'}, layout wants "
                f"{'on' if w.target.mig_enabled else 'off'}"
            )
            continue
        if w.pending != w.target.mig_enabled:
            diffs.append(f"GPU {w.index}: a MIG mode change is pending (reset required)")
        diffs += [f"GPU {w.index}: half-made instance {i.label}" for i in w.halfmade]
        if w.plan is not None:
            diffs += [f"GPU {w.index}: has {i.label}, not in the layout" for i in w.plan.destroy]
            diffs += [f"GPU {w.index}: lacks {c.profile}" for c in w.plan.create]
        elif w.error is not None:
            diffs.append(f"GPU {w.index}: {w.error}")
    return sorted(diffs, key=lambda d: int(d.split(":", 1)[0].removeprefix("GPU ")))
