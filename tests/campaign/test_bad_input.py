"""Fuzzed layout, hooks and agent-config files (bytes, YAML tags, truncation) and damaged
simulated-node state: nothing may escape as a traceback.

A file case survives when the loader accepts it or raises its one documented error
(``ConfigError``, file:line), and the agent's MIG reconciler, given the file, reports it and
stays ready; anything else that escapes is lost. A state case survives when `nodeagent gpus`
answers (exit 0/1) or refuses in one line (exit 2).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from nodeagent.cli.main import app
from nodeagent.config.errors import ConfigError
from nodeagent.config.schema import load_agent_config
from nodeagent.sim.control import SimControl
from nodeagent.sim.state import STATE_FILE
from nodeagent_mig.config import DEFAULT_CONFIG_FILE, load_config, load_hooks
from nodeagent_mig.reconciler import MigReconciler
from tests.campaign.conftest import Tally, size

HOOKS = b"""version: v1
hooks:
  apply-start:
    - command: /bin/true
      args: ["-c", "x"]
      envs: {A: "1"}
"""
AGENT = b"""version: v1
node: {name: n1, pool: p}
sampler: {interval_s: 1}
mig: {enabled: true, allow_reset: false}
health: {recovery_quiet_s: 300, ignore_xids: [45]}
device_plugin: {mig_strategy: mixed}
pools:
  p: {mig_layout: all-1g, sharing: {mode: time-slicing, replicas: 2}}
"""
TAGS = (b"!!python/object:os.system", b"!!binary", b"!foo", b"!!set", b"!!omap", b"!!timestamp")
NASTY = (b"\xff", b"\xfe\xff", b"\x00", b"\xc3\x28", b"&a", b"*a", b"<<: *a", b"{", b"]", b"\t")


def mutate(seed: bytes, rng: random.Random) -> bytes:
    """One to three edits: a tag, a bad byte, a cut, a duplicated or dropped line."""
    data = bytearray(seed)
    for _ in range(rng.randint(1, 3)):
        where = rng.randrange(len(data) + 1)
        kind = rng.randrange(5)
        if kind == 0:
            data[where:where] = b" " + rng.choice(TAGS) + b" "
        elif kind == 1:
            data[where:where] = rng.choice(NASTY)
        elif kind == 2:
            del data[where:]
        elif kind == 3 and data:
            data[where:where] = bytes([rng.randrange(256)])
        else:
            lines = bytes(data).split(b"\n")
            i = rng.randrange(len(lines))
            lines.insert(i, lines[i]) if rng.random() < 0.5 else lines.pop(i)
            data = bytearray(b"\n".join(lines))
    return bytes(data)


def check_loader(
    tally: Tally, label: str, content: bytes, load: Callable[[], Any], documented: type
) -> None:
    try:
        load()
    except documented:
        tally.ok()
    except Exception as exc:  # noqa: BLE001 - counting what escapes is the point
        tally.lose(f"{label} {content[:60]!r}: {type(exc).__name__}: {exc}")
    else:
        tally.ok()


def test_fuzzed_layout_hooks_and_agent_files(tmp_path: Path, tally: Tally) -> None:
    rng = random.Random(17)
    layouts = DEFAULT_CONFIG_FILE.read_bytes()
    path = tmp_path / "file.yaml"
    for case in range(size(ci=300, long=3000)):
        which = case % 3
        seed = (layouts, HOOKS, AGENT)[which]
        content = mutate(seed, rng)
        path.write_bytes(content)
        if which == 0:
            check_loader(tally, "layout", content, lambda: load_config(path), ConfigError)
        elif which == 1:
            check_loader(tally, "hooks", content, lambda: load_hooks(path), ConfigError)
        else:
            check_loader(
                tally,
                "agent",
                content,
                lambda: load_agent_config(path, environ={}),
                ConfigError,
            )
    tally.verify()


def test_the_reconciler_survives_every_fuzzed_layout(
    make_node, tmp_path: Path, tally: Tally
) -> None:
    rng = random.Random(23)
    node = make_node("a30x4")
    layouts = DEFAULT_CONFIG_FILE.read_bytes()
    for case in range(size(ci=25, long=400)):
        bad = tmp_path / f"l{case}.yaml"
        bad.write_bytes(mutate(layouts, rng))
        cfg = tmp_path / f"a{case}.yaml"
        cfg.write_text(
            f"version: v1\nstate_dir: {tmp_path / f's{case}'}\n"
            f"mig: {{layout_file: '{bad}'}}\npools:\n  default: {{mig_layout: all-1g}}\n"
        )
        config = load_agent_config(cfg, environ={})
        reconciler = MigReconciler(node, config, lock_file=tmp_path / "mig.lock")
        stop = threading.Event()
        crashed: list[BaseException] = []
        thread = threading.Thread(target=run_recording, args=(reconciler, stop, crashed))
        thread.start()
        for _ in range(500):
            if reconciler.ready or crashed:
                break
            stop.wait(0.01)
        stop.set()
        reconciler.reload(config)  # wakes the loop, which then sees the stop
        thread.join(5)
        if crashed:
            tally.lose(f"case {case}: {type(crashed[0]).__name__}: {crashed[0]}")
        elif not reconciler.ready:
            tally.lose(f"case {case}: never ready")
        else:
            tally.ok()
    tally.verify()


def run_recording(r: MigReconciler, stop: threading.Event, crashed: list[BaseException]) -> None:
    """The reconciler's run loop, recording what escapes it instead of dying silently."""
    try:
        r.run(stop)
    except BaseException as exc:  # noqa: BLE001 - a crash is what is counted
        crashed.append(exc)


def test_damaged_simulated_state(tmp_path: Path, tally: Tally) -> None:
    rng = random.Random(29)
    seed = tmp_path / "seed"
    SimControl(seed, "t4").state()
    good = (seed / STATE_FILE).read_bytes()
    runner = CliRunner()
    for case in range(size(ci=50, long=500)):
        sim = tmp_path / f"s{case}"
        sim.mkdir()
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            where = rng.randrange(len(data))
            if rng.random() < 0.3:
                del data[where:]
            else:
                data[where] = rng.choice(b'{}[]":,0x\xff')
        (sim / STATE_FILE).write_bytes(bytes(data))
        result = runner.invoke(app, ["gpus", "--simulate", "t4", "--state-dir", str(sim)])
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            exc = result.exception
            tally.lose(f"case {case}: {type(exc).__name__}: {exc}")
        elif result.exit_code == 2 and len(result.stderr.strip().splitlines()) > 2:
            tally.lose(f"case {case}: {result.stderr[:200]}")
        else:
            tally.ok()
    tally.verify()
