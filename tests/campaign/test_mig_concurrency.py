"""MIG applies that overlap, and applies killed with SIGKILL while a second one waits.

Every apply is a real process on one simulated node. A case *survives* when the node ends in
exactly the layout of the apply that held the node's MIG lock last, with every GPU instance
whole (one compute instance each), and every apply exited 0 (or 2 for one that gave up
waiting for the lock, having changed nothing).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from nodeagent.agent.backend import mig_lock_file, open_node
from nodeagent.sim.control import SimControl
from nodeagent_mig.apply import INTENT_FILE, reconcile
from nodeagent_mig.config import DEFAULT_CONFIG_FILE, load_config
from tests.campaign.conftest import Tally, size

PRESET = "a30x4"  # four GPUs: a full apply takes a fraction of a second
LAYOUTS = ("all-1g", "all-2g", "all-balanced", "all-4g", "all-disabled")


def env_for(sim: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
    env.update(NODEAGENT_SIMULATE=PRESET, NODEAGENT_SIM_STATE=str(sim))
    return env


def layout_of(sim: Path) -> list[Counter[str] | None]:
    """Per GPU: the profile counts (None when MIG is off), checking every instance is whole."""
    node = open_node(simulate=PRESET, state_dir=sim)
    try:
        out: list[Counter[str] | None] = []
        for i in range(node.count()):
            if not node.info(i).mig_enabled:
                out.append(None)
                continue
            gis = node.mig_instances(i)
            assert all(len(g.compute_instances) == 1 for g in gis), f"GPU {i}: half-made {gis}"
            out.append(Counter(g.profile for g in gis))
        return out
    finally:
        node.close()


def expected(sim_seed: Path, name: str, scratch: Path) -> list[Counter[str] | None]:
    """What ``name`` looks like on this node: applied once, alone, on a copy."""
    probe = scratch / f"expect-{name}"
    if not probe.exists():
        shutil.copytree(sim_seed, probe)
        node = open_node(simulate=PRESET, state_dir=probe)
        cfg = load_config(DEFAULT_CONFIG_FILE)
        assert reconcile(node, cfg, name, state_dir=scratch / "x", allow_reset=True).ok
        node.close()
    return layout_of(probe)


def apply(sim: Path, name: str, state: Path) -> subprocess.Popen[str]:
    options = ["--allow-reset", "--lock-timeout", "60", "--mig-state-dir", str(state), "--json"]
    return subprocess.Popen(
        [sys.executable, "-m", "nodeagent.cli.main", "mig", "apply", "-c", name, "--yes", *options],
        env=env_for(sim),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def last_holder(sim: Path, procs: list[subprocess.Popen[str]]) -> int:
    """The index in ``procs`` of the process that took the node's MIG lock last.

    The lock file keeps its last holder's PID until the next holder writes its own, so it names
    the last one once both have exited. (The exit order does not: on a loaded machine the first
    apply can still be shutting down after the second has applied and exited.)
    """
    holder = int(mig_lock_file(PRESET, sim).read_text().split()[0])
    return [p.pid for p in procs].index(holder)


def seed_node(tmp_path: Path) -> Path:
    seed = tmp_path / "seed"
    SimControl(seed, PRESET).state()
    node = open_node(simulate=PRESET, state_dir=seed)
    cfg = load_config(DEFAULT_CONFIG_FILE)
    assert reconcile(node, cfg, "all-balanced", state_dir=tmp_path / "s0", allow_reset=True).ok
    node.close()
    return seed


def test_overlapping_applies(tmp_path: Path, tally: Tally) -> None:
    """Pairs of applies of two layouts started a seeded few milliseconds apart."""
    rng = random.Random(11)
    seed = seed_node(tmp_path)
    for case in range(size(ci=5, long=24)):
        a, b = rng.sample(LAYOUTS, 2)
        sim = tmp_path / f"pair{case}"
        shutil.copytree(seed, sim)
        first = apply(sim, a, tmp_path / f"a{case}")
        time.sleep(rng.uniform(0.0, 0.4))  # from "same moment" to "while it applies"
        second = apply(sim, b, tmp_path / f"b{case}")
        procs = [first, second]
        for proc in procs:
            proc.wait(120)
        codes = [p.returncode for p in procs]
        errors = [p.stderr.read() if p.stderr else "" for p in procs]
        last = (a, b)[last_holder(sim, procs)]
        try:
            assert codes == [0, 0], (codes, errors)
            assert all("Traceback" not in e for e in errors)
            assert layout_of(sim) == expected(seed, last, tmp_path), f"{a} then {b}"
        except AssertionError as exc:
            tally.lose(f"pair {case} ({a} / {b}): {exc}")
            continue
        tally.ok()
    tally.verify()


# The first apply holds the node's MIG lock as `mig apply` does and kills itself before step K.
KILLED = """
import os, signal, sys
from pathlib import Path
from nodeagent.agent.backend import mig_lock_file, open_node
from nodeagent.runtime.lock import ProcessLock
from nodeagent_mig.apply import reconcile
from nodeagent_mig.config import DEFAULT_CONFIG_FILE, load_config
preset, sim, state, name, kill_at = sys.argv[1:]
lock = ProcessLock(mig_lock_file(preset, Path(sim)), "the node's MIG layout")
lock.acquire(30)
print("locked", flush=True)

def on_step(number, what):
    if number == int(kill_at):
        os.kill(os.getpid(), signal.SIGKILL)

node = open_node(simulate=preset, state_dir=Path(sim))
reconcile(node, load_config(DEFAULT_CONFIG_FILE), name, state_dir=Path(state),
          allow_reset=True, on_step=on_step)
"""


def test_kill_at_every_step_under_a_second_apply(tmp_path: Path, tally: Tally) -> None:
    """SIGKILL an apply before step K while another apply of another layout waits for it."""
    seed = seed_node(tmp_path)
    cfg = load_config(DEFAULT_CONFIG_FILE)
    dying, waiting = "all-1g", "all-2g"
    probe = tmp_path / "probe"
    shutil.copytree(seed, probe)
    steps: list[str] = []
    node = open_node(simulate=PRESET, state_dir=probe)
    assert reconcile(
        node, cfg, dying, state_dir=tmp_path / "p", allow_reset=True,
        on_step=lambda n, what: steps.append(what),
    ).ok  # fmt: skip
    node.close()
    rng = random.Random(5)
    ks = list(range(1, len(steps) + 1))
    chosen = sorted(rng.sample(ks, min(len(ks), size(ci=5, long=len(ks)))))
    want = expected(seed, waiting, tmp_path)
    for k in chosen:
        sim = tmp_path / f"k{k}"
        shutil.copytree(seed, sim)
        state_a = tmp_path / f"state-a{k}"
        killed = subprocess.Popen(
            [sys.executable, "-c", KILLED, PRESET, str(sim), str(state_a), dying, str(k)],
            env=env_for(sim),
            stdout=subprocess.PIPE,
            text=True,
        )
        assert killed.stdout is not None
        assert killed.stdout.readline().strip() == "locked"
        second = apply(sim, waiting, tmp_path / f"state-b{k}")
        killed.wait(60)
        out, err = second.communicate(timeout=120)
        try:
            assert killed.returncode == -signal.SIGKILL, killed.returncode
            assert second.returncode == 0, err
            assert json.loads(out)["ok"], out
            assert layout_of(sim) == want
            # The killed apply's intent stays in its own state directory, untouched by the
            # other; its next run there finds it and converges on its own layout.
            assert (state_a / INTENT_FILE).exists()
            node = open_node(simulate=PRESET, state_dir=sim)
            again = reconcile(node, cfg, dying, state_dir=state_a, allow_reset=True)
            node.close()
            assert again.ok
            assert again.resumed_from == dying
            assert layout_of(sim) == expected(seed, dying, tmp_path)
        except AssertionError as exc:
            tally.lose(f"kill before step {k} ({steps[k - 1]}): {exc}")
            continue
        tally.ok()
    tally.verify()
