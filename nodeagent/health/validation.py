"""Remediation steps that gate a GPU's return: reset (where allowed) and validation.

With ``pools.<pool>.remediation.enabled`` the health model holds a GPU whose unhealthy fault
has cleared (state ``unhealthy``, reason "awaiting validation"), so the device plugin keeps it
withdrawn. This validator then runs the pool's steps in order, one GPU at a time:

- ``reset``: resets the GPU, only where ``allow_reset`` is set, no compute process runs on it,
  and fewer than ``max_resets`` resets happened in the last ``reset_period_s`` on this node;
  otherwise the step is skipped (and says why). The resets are kept in the state directory
  (``health/resets.json``, written before each reset), so an agent that restarts, or crashes
  in a loop, cannot exceed the cap; a history that cannot be read or written stops resets
  (fail closed) until it is fixed, and says so;
- ``validate``: runs the operator's ``validate_command`` with ``CUDA_VISIBLE_DEVICES`` set to
  the GPU; exit 0 within ``validate_timeout_s`` passes. Without a command it passes at once.

A step that fails (a reset that raises, a validation that fails) keeps the GPU held with the
failure as its reason, and the GPU is tried again after ``retry_s``. When every step has
passed (or was skipped), the GPU is released and healthy again. Every step is logged, counted
(``nodeagent_gpu_remediation_steps_total``), and recorded as an Event on the node; the last
validation's result and output tail are kept for the metrics and the log.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Annotated

from pydantic import ConfigDict, Field, TypeAdapter

from nodeagent.atomicfile import read_json_as, write_json_atomic
from nodeagent.config.pool_policy import RemediationPolicy
from nodeagent.gpu.errors import GpuError
from nodeagent.health.model import HealthModel
from nodeagent.kube.events import EventRecorder
from nodeagent.kube.node_patcher import KubeUnavailableError

log = logging.getLogger(__name__)

# The reset history file: the wall-clock times of the resets made, strictly numbers.
_RESET_TIMES = TypeAdapter(
    list[Annotated[float, Field(allow_inf_nan=False)]],
    config=ConfigDict(strict=True, defer_build=True),
)

OUTPUT_TAIL_BYTES = 2048
POLL_S = 1.0
RESETS_FILE = "resets.json"  # under <state_dir>/health: the wall-clock times of recent resets


@dataclass(frozen=True, slots=True)
class StepResult:
    """One step on one GPU."""

    gpu_index: int
    uuid: str
    step: str  # "reset" or "validate"
    result: str  # "passed", "failed", "skipped"
    detail: str
    finished_s: float


@dataclass(eq=False)
class GpuValidator:
    """Runs the remediation steps of the GPUs the model holds for validation."""

    model: HealthModel
    policy: Callable[[], RemediationPolicy]
    _: KW_ONLY
    reset: Callable[[int], None]
    processes: Callable[[int], int]  # how many processes run on a GPU
    recorder: EventRecorder | None = None
    clock: Callable[[], float] = time.time
    resets_file: Path | None = None  # where the reset history survives restarts; None: memory
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _resets: deque[float] = field(default_factory=deque, init=False)
    # Why the reset history cannot be trusted (resets are refused meanwhile), else None.
    _history_broken: str | None = field(default=None, init=False)
    _retry_at: dict[str, float] = field(default_factory=dict, init=False)
    _counts: dict[tuple[int, str, str, str], int] = field(default_factory=dict, init=False)
    # The last validate step per GPU UUID.
    last: dict[str, StepResult] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if self.resets_file is None:
            return
        try:
            kept = read_json_as(self.resets_file, _RESET_TIMES)
            if kept is None:
                return
            self._resets.extend(sorted(kept))
        except (OSError, ValueError) as exc:
            self._history_broken = f"the reset history is unusable ({exc}); fix or remove it"
            log.error("remediation: %s; GPU resets are refused until then", self._history_broken)

    def _keep_reset(self, at: float) -> str | None:
        """Record a reset about to happen; why it must not happen when it cannot be kept."""
        self._resets.append(at)
        if self.resets_file is None:
            return None
        try:
            write_json_atomic(self.resets_file, list(self._resets))
        except OSError as exc:
            self._resets.pop()
            return f"cannot record it in {self.resets_file} ({exc.strerror or exc})"
        return None

    def counts(self) -> Mapping[tuple[int, str, str, str], int]:
        """Steps by (GPU index, UUID, step, result) since the agent started."""
        with self._lock:
            return dict(self._counts)

    def passed(self) -> Mapping[str, bool]:
        """Whether the last validate step passed, per GPU UUID."""
        with self._lock:
            return {uuid: r.result == "passed" for uuid, r in self.last.items()}

    def last_validation(self) -> Mapping[str, StepResult]:
        """The last validate step per GPU UUID."""
        with self._lock:
            return dict(self.last)

    def _record(self, result: StepResult) -> None:
        with self._lock:
            key = (result.gpu_index, result.uuid, result.step, result.result)
            self._counts[key] = self._counts.get(key, 0) + 1
            if result.step == "validate":
                self.last[result.uuid] = result
        failed = result.result == "failed"
        message = f"GPU {result.gpu_index} ({result.uuid}): {result.step} {result.result}"
        if result.detail:
            message += f": {result.detail}"
        log.log(logging.WARNING if failed else logging.INFO, "remediation: %s", message)
        if self.recorder is not None:
            reason = f"GPURemediation{result.step.capitalize()}{result.result.capitalize()}"
            try:
                self.recorder.node_event(reason, message, warning=failed)
            except KubeUnavailableError as exc:
                log.warning("could not record the remediation Event: %s", exc)

    def _step_reset(self, index: int, uuid: str, policy: RemediationPolicy) -> StepResult:
        now = self.clock()
        while self._resets and now - self._resets[0] >= policy.reset_period_s:
            self._resets.popleft()
        why = None
        if not policy.allow_reset:
            why = "resets are not allowed (remediation.allow_reset is false)"
        elif self._history_broken is not None:
            why = self._history_broken
        elif len(self._resets) >= policy.max_resets:
            why = (
                f"{len(self._resets)} reset(s) in the last {policy.reset_period_s:g}s: cap reached"
            )
        elif (running := self.processes(index)) > 0:
            why = f"{running} process(es) run on it"
        if why is None:
            why = self._keep_reset(now)
        if why is not None:
            return StepResult(index, uuid, "reset", "skipped", why, now)
        try:
            self.reset(index)
        except GpuError as exc:
            return StepResult(index, uuid, "reset", "failed", str(exc), self.clock())
        return StepResult(index, uuid, "reset", "passed", "", self.clock())

    def _step_validate(self, index: int, uuid: str, policy: RemediationPolicy) -> StepResult:
        if not policy.validate_command:
            return StepResult(index, uuid, "validate", "passed", "no command configured", 0.0)
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": uuid, "NODEAGENT_VALIDATE_GPU": str(index)}
        try:
            done = subprocess.run(
                list(policy.validate_command),
                env=env,
                capture_output=True,
                timeout=policy.validate_timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            detail = f"timed out after {policy.validate_timeout_s:g}s"
            return StepResult(index, uuid, "validate", "failed", detail, self.clock())
        except OSError as exc:
            return StepResult(index, uuid, "validate", "failed", f"could not start: {exc}", 0.0)
        tail = (done.stdout + done.stderr)[-OUTPUT_TAIL_BYTES:].decode(errors="replace").strip()
        result = "passed" if done.returncode == 0 else "failed"
        detail = f"exit {done.returncode}" + (f": {tail}" if tail else "")
        return StepResult(index, uuid, "validate", result, detail, self.clock())

    def run_once(self) -> list[StepResult]:
        """Run the steps of every held GPU that is due; returns the steps run."""
        policy = self.policy()
        out: list[StepResult] = []
        for index, uuid, _ in self.model.pending_validation():
            if self.clock() < self._retry_at.get(uuid, float("-inf")):
                continue
            failed: StepResult | None = None
            for step in policy.steps:
                run = self._step_reset if step == "reset" else self._step_validate
                result = run(index, uuid, policy)
                self._record(result)
                out.append(result)
                if result.result == "failed":
                    failed = result
                    break
            if failed is None:
                self._retry_at.pop(uuid, None)
                self.model.finish_validation(uuid, True, "")
                log.info("GPU %d (%s): remediation steps passed; it serves again", index, uuid)
            else:
                self._retry_at[uuid] = self.clock() + policy.retry_s
                self.model.finish_validation(
                    uuid, False, f"{failed.step}: {failed.detail}", retry_s=policy.retry_s
                )
        return out

    def run(self, stop: threading.Event) -> None:
        """Run due steps until ``stop`` is set."""
        while not stop.wait(POLL_S):
            self.run_once()
