"""Fuzzing every loader: whatever a file holds, the only exception that escapes is ConfigError.

Two sources of input: random bytes, and documents generated from each format's own schema
(every section and field, values at and beyond their bounds, wrong types, NaN, unknown keys),
some with tags or bytes spliced in, so that validation runs all the way down. The MIG layouts
also go through ``resolve`` on a simulated node, and the agent config through environment
overrides and the GPU check.
"""

from __future__ import annotations

import enum
import functools
import tempfile
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from nodeagent.agent.backend import open_node
from nodeagent.config.errors import ConfigError
from nodeagent.config.loader import env_names, key_of, unwrap
from nodeagent.config.schema import AgentConfig, check_gpu_indices, load_agent_config
from nodeagent.config.yamlfile import parse_document
from nodeagent_mig import config as migcfg
from nodeagent_mig.config import GpuFacts, gpu_facts, parse_config, parse_hooks, resolve
from nodeagent_tiering.cluster.tier_policy import TierPolicy, parse_policy

FUZZ = settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


MAGIC = ["v1", "v2", "all", "mps", "time-slicing", "exclusive", "0x233010DE", "0x20B010DE",
         "1e-9", "nan", "-1", "10%", "150%", "In", "Exists", "Gt", "", " ", "a" * 300, "GPU-0",
         "0:1", "127.0.0.1:0", "nvidia.com/gpu", "nvidia.com/gpu.shared", "1g.5gb", "7g.40gb",
         "3g.20gb", "default", "0", "7", "64"]  # fmt: skip
hostile = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(MAGIC),
    st.text(max_size=12),
    st.lists(st.integers(-2, 70), max_size=3),
    st.dictionaries(st.sampled_from(MAGIC), st.integers(-2, 9), max_size=2),
)


def _value(hint: Any) -> st.SearchStrategy[Any]:
    """Values of this type, mostly valid, often at or beyond their bounds, sometimes absurd."""
    inner, optional = unwrap(hint)
    origin = typing.get_origin(inner)
    args = typing.get_args(inner)
    base: st.SearchStrategy[Any]
    if isinstance(inner, type) and issubclass(inner, BaseModel):
        base = _section(inner)
    elif origin is dict:
        base = st.dictionaries(st.sampled_from(MAGIC), _value(args[1]), max_size=3)
    elif origin is tuple:
        base = st.lists(_value(args[0]), max_size=3)
    elif origin is typing.Literal:
        base = st.sampled_from(args)
    elif origin in (typing.Union, types.UnionType):
        base = st.one_of([_value(a) for a in args])
    elif isinstance(inner, type) and issubclass(inner, enum.Enum):
        base = st.sampled_from([m.value for m in inner])
    elif inner is bool:
        base = st.booleans()
    elif inner is int:
        base = st.integers(min_value=-5, max_value=2**40)
    elif inner is float:
        base = st.floats(min_value=-1e12, max_value=1e12) | st.sampled_from([0.0, 1e-9, 0.05])
    else:  # str, Path
        base = st.sampled_from(MAGIC) | st.text(max_size=10)
    if optional:
        base = base | st.none()
    return base | base | base | hostile


@functools.cache
def _section(model: type[BaseModel]) -> st.SearchStrategy[dict[str, Any]]:
    """Mappings with any of the model's keys (and now and then one it does not have)."""
    fields = {key_of(n, i): _value(i.annotation) for n, i in model.model_fields.items()}
    known = st.fixed_dictionaries({}, optional=fields)
    unknown = st.dictionaries(st.sampled_from(MAGIC), hostile, max_size=1)
    return st.builds(lambda a, b: {**b, **a}, known, unknown)


TAGS = [b"!!python/object:os.system ", b"!foo ", b"!!binary ", b"!!set ", b"&a ", b"*a ", b"<<: "]


def files(model: type[BaseModel]) -> st.SearchStrategy[bytes]:
    """Whole files of a format: random bytes, or documents of its schema, sometimes damaged."""

    @st.composite
    def document(draw: st.DrawFn) -> bytes:
        body = draw(_section(model))
        if draw(st.integers(0, 9)):
            body = {"version": "v1", **body}
        text = yaml.safe_dump(body, allow_unicode=True).encode()
        for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):
            at = draw(st.integers(0, len(text)))
            splice = draw(st.one_of(st.sampled_from(TAGS), st.binary(max_size=4)))
            text = text[:at] + splice + text[at:]
        return text

    return st.binary(max_size=200) | document()


@functools.cache
def _node() -> tuple[list[GpuFacts], int]:
    with tempfile.TemporaryDirectory() as tmp:
        node = open_node(simulate="dgx-a100", state_dir=Path(tmp))
        try:
            return gpu_facts(node), node.count()
        finally:
            node.close()


def _only_config_errors(action: Any) -> None:
    """Run ``action``; a ConfigError (which must say what is wrong) is fine, nothing else is."""
    problems: tuple[object, ...] = ("ok",)
    try:
        action()
    except ConfigError as exc:
        problems = exc.problems
    assert problems, "a ConfigError always says what is wrong"
    assert all(str(p) for p in problems)


@FUZZ
@given(content=files(migcfg.LayoutSchema))
def test_mig_layouts(content: bytes) -> None:
    def load_and_resolve() -> None:
        cfg = parse_config(content, "layouts.yaml")
        facts, _ = _node()
        for name in cfg.configs:
            _only_config_errors(lambda name=name: resolve(cfg, name, facts))

    _only_config_errors(load_and_resolve)


@FUZZ
@given(content=files(migcfg.HooksSchema))
def test_mig_hooks(content: bytes) -> None:
    _only_config_errors(lambda: parse_hooks(content, "hooks.yaml"))


@FUZZ
@given(content=files(TierPolicy))
def test_tier_policies(content: bytes) -> None:
    _only_config_errors(lambda: parse_policy(parse_document(content, "policy.yaml").data))


ENV_NAMES = env_names(AgentConfig)


@FUZZ
@given(
    content=files(AgentConfig),
    env=st.dictionaries(st.sampled_from(ENV_NAMES), st.text(max_size=12), max_size=3),
)
def test_agent_configs(tmp_path: Path, content: bytes, env: dict[str, str]) -> None:
    path = tmp_path / "agent.yaml"
    path.write_bytes(content)

    def load_and_check() -> None:
        config = load_agent_config(path, environ=env)
        _, count = _node()
        check_gpu_indices(config, count, path)
        config.describe()

    _only_config_errors(load_and_check)
