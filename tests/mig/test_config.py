"""Layout and hooks files: mig-parted v1 accepted as is, every problem reported with its line."""

from __future__ import annotations

import textwrap

import pytest

from nodeagent.config.errors import ConfigError
from nodeagent.gpu.types import MigGeometry
from nodeagent_mig.config import (
    DEFAULT_CONFIG_FILE,
    GpuFacts,
    GpuTarget,
    MigConfigFile,
    load_config,
    parse_config,
    parse_hooks,
    render_config,
    resolve,
)

PCI_BY_NAME = {"A100": 0x20B010DE, "H100": 0x233010DE, "H200": 0x233510DE, "A30": 0x20B710DE}


def pci_for(geometry: MigGeometry) -> int:
    """The PCI device id of the model (A100 means the 40GB part in these fixtures)."""
    return next(pci for key, pci in PCI_BY_NAME.items() if key in geometry.model)


def node_of(geometry: MigGeometry, n: int = 8) -> list[GpuFacts]:
    return [GpuFacts(i, geometry.model, pci_for(geometry), geometry) for i in range(n)]


def parse(text: str) -> MigConfigFile:
    return parse_config(textwrap.dedent(text).lstrip(), "layouts.yaml")


def test_default_file_resolves_on_every_model(geometry: MigGeometry) -> None:
    cfg = load_config(DEFAULT_CONFIG_FILE)
    standard = ["all-disabled", "all-enabled", "all-1g", "all-2g", "all-4g", "all-balanced"]
    if geometry.memory_slices == 8:
        standard += ["all-3g", "all-7g"]
    for name in standard:
        targets = resolve(cfg, name, node_of(geometry))
        assert sorted(targets) == list(range(8)), name
        assert all(t.mig_enabled == (name != "all-disabled") for t in targets.values())


def test_mig_parted_file_is_accepted_unchanged(a100: MigGeometry) -> None:
    cfg = parse(
        """
        version: v1
        mig-configs:
          custom:
            - devices: [0, 1]
              mig-enabled: true
              mig-devices:
                "1g.5gb": 2
                "2g.10gb": 1
                "3g.20gb": 1
            - devices: [2]
              device-filter: "0x20B010DE"
              mig-enabled: false
        """
    )
    targets = resolve(cfg, "custom", node_of(a100, 4))
    assert targets == {
        0: GpuTarget(0, True, {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}),
        1: GpuTarget(1, True, {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}),
        2: GpuTarget(2, False, {}),
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "version: v2\nmig-configs: {}\n",
            ["layouts.yaml:1: version: unsupported version 'v2'"],
            id="unknown-version",
        ),
        pytest.param(
            "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n"
            "      mig-devics: {}\n",
            ["layouts.yaml:6: mig-configs.a[0].mig-devics: unknown field"],
            id="unknown-field-with-line",
        ),
        pytest.param(
            "version: v1\nmig-configs:\n  a:\n    - devices: 0\n      mig-enabled: yes please\n",
            [
                "layouts.yaml:4: mig-configs.a[0].devices: expected `all` or a list",
                "layouts.yaml:5: mig-configs.a[0].mig-enabled: expected true or false",
            ],
            id="all-problems-at-once",
        ),
        pytest.param(
            "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: false\n"
            "      mig-devices: {'1g.5gb': 1}\n",
            ["layouts.yaml:6: mig-configs.a[0].mig-devices: must be empty when mig-enabled"],
            id="devices-when-disabled",
        ),
        pytest.param(
            "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n"
            "      device-filter: [A100]\n",
            ["layouts.yaml:6: mig-configs.a[0].device-filter[0]: 'A100' is not a PCI device id"],
            id="bad-filter",
        ),
        pytest.param("mig-configs: [\n", ["layouts.yaml:2: not valid YAML"], id="broken-yaml"),
    ],
)
def test_structural_errors(text: str, expected: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(text, "layouts.yaml")
    lines = [str(p) for p in err.value.problems]
    assert len(lines) == len(expected), lines
    for got, want in zip(lines, expected, strict=True):
        assert got.startswith(want), got


BAD_LAYOUTS = """
version: v1
mig-configs:
  bad:
    - devices: [0]
      mig-enabled: true
      mig-devices:
        "1g.10gb": 2
        "5g.30gb": 1
    - devices: [1]
      mig-enabled: true
      mig-devices:
        "1g.5gb+me": 3
    - devices: [2, 3]
      mig-enabled: true
      mig-devices:
        "4g.20gb": 1
        "2g.10gb": 2
    - devices: [9]
      mig-enabled: false
    - devices: [3]
      mig-enabled: false
"""


def test_semantic_errors_all_at_once(a100: MigGeometry) -> None:
    cfg = parse(BAD_LAYOUTS)
    with pytest.raises(ConfigError) as err:
        resolve(cfg, "bad", node_of(a100, 4))
    text = [str(p) for p in err.value.problems]
    assert any(
        t.startswith(
            "layouts.yaml:8: mig-configs.bad[0].mig-devices.5g.30gb: GPU 0: "
            "NVIDIA A100-SXM4-40GB offers no profile '5g.30gb' (it offers 7g.40gb,"
        )
        for t in text
    ), text
    assert any(
        "layouts.yaml:12: mig-configs.bad[1].mig-devices.1g.5gb+me: GPU 1: 3 x 1g.5gb+me "
        "asked, at most 1 fit" in t
        for t in text
    ), text
    assert any(
        "layouts.yaml:15: mig-configs.bad[2].mig-devices: GPU 2,3: no valid placement: "
        "2g.10gb #2 cannot be placed beside 4g.20gb x1, 2g.10gb x1" in t
        for t in text
    ), text
    assert any("mig-configs.bad[3].devices: no GPU 9 on this node" in t for t in text), text
    assert any("GPU 3 is already selected by mig-configs.bad[2]" in t for t in text), text
    assert len(text) == 5


def test_unknown_layout_name_lists_names(a100: MigGeometry) -> None:
    cfg = parse(BAD_LAYOUTS)
    with pytest.raises(ConfigError, match=r"no layout named 'good' \(the file has: bad\)"):
        resolve(cfg, "good", node_of(a100))


def test_selector_matching_no_gpu(a100: MigGeometry) -> None:
    cfg = parse(
        """
        version: v1
        mig-configs:
          h100-only:
            - device-filter: ["0x233010DE"]
              devices: all
              mig-enabled: true
              mig-devices: {"7g.80gb": 1}
        """
    )
    with pytest.raises(ConfigError, match=r"layouts\.yaml:3: mig-configs\.h100-only: selects no"):
        resolve(cfg, "h100-only", node_of(a100))


# Selectors in a layout with per-model entries, resolved on an 8-GPU H100 node (the review's
# case: an A100 entry beside an H100 entry, as in mig-parted's shared files).
A100_ENTRY = """
    - device-filter: ["0x20B010DE"]
      devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 7}"""
H100_ENTRY = """
    - device-filter: ["0x233010DE"]
      devices: all
      mig-enabled: true
      mig-devices: {"1g.10gb": 7}"""
A30_ENTRY = """
    - device-filter: "0x20B710DE"
      devices: all
      mig-enabled: true
      mig-devices: {"1g.6gb": 4}"""
INDEX_9 = """
    - devices: [9]
      mig-enabled: true
      mig-devices: {"1g.10gb": 7}"""
A100_INDEX_9 = """
    - device-filter: ["0x20B010DE"]
      devices: [9]
      mig-enabled: true
      mig-devices: {"1g.5gb": 7}"""


@pytest.mark.parametrize(
    ("entries", "selected", "errors"),
    [
        pytest.param([A100_ENTRY, H100_ENTRY], 8, [], id="other-model-entry-beside-match"),
        pytest.param([H100_ENTRY, A100_ENTRY], 8, [], id="match-listed-first"),
        pytest.param(
            [A100_ENTRY, A30_ENTRY],
            0,
            ["layouts.yaml:3: mig-configs.shared: selects no MIG-capable GPU on this node"],
            id="no-entry-matches",
        ),
        pytest.param(
            [H100_ENTRY, INDEX_9],
            0,
            ["layouts.yaml:8: mig-configs.shared[1].devices: no GPU 9 on this node"],
            id="index-out-of-range-beside-match",
        ),
        pytest.param(
            [H100_ENTRY, A100_INDEX_9],
            0,
            ["layouts.yaml:9: mig-configs.shared[1].devices: no GPU 9 on this node"],
            id="index-out-of-range-in-other-model-entry",
        ),
        pytest.param(
            [A100_ENTRY, INDEX_9],
            0,
            [
                "layouts.yaml:3: mig-configs.shared: selects no MIG-capable GPU on this node",
                "layouts.yaml:8: mig-configs.shared[1].devices: no GPU 9 on this node",
            ],
            id="index-out-of-range-and-nothing-selected",
        ),
    ],
)
def test_selectors_in_per_model_layouts(
    h100: MigGeometry, entries: list[str], selected: int, errors: list[str]
) -> None:
    """A filter for a model the node lacks is fine beside an entry that selects its GPUs;
    a layout that selects nothing here, or names an index the node lacks, is an error."""
    cfg = parse("version: v1\nmig-configs:\n  shared:" + "".join(entries) + "\n")
    if not errors:
        targets = resolve(cfg, "shared", node_of(h100))
        assert sorted(targets) == list(range(selected))
        assert all(t.devices == {"1g.10gb": 7} for t in targets.values())
        return
    with pytest.raises(ConfigError) as err:
        resolve(cfg, "shared", node_of(h100))
    text = [str(p) for p in err.value.problems]
    assert len(text) == len(errors), text
    for got, want in zip(text, errors, strict=True):
        assert got.startswith(want), text


@pytest.mark.parametrize(
    ("model", "want"), [pytest.param("a100", 4, id="a100-40"), pytest.param("h100", 7, id="h100")]
)
def test_shipped_per_model_layout_resolves_on_each_model(
    request: pytest.FixtureRequest, model: str, want: int
) -> None:
    """`all-1g.10gb` holds entries for A100-40GB, A100-80GB and H100: each node takes its own."""
    geometry: MigGeometry = request.getfixturevalue(model)
    targets = resolve(load_config(DEFAULT_CONFIG_FILE), "all-1g.10gb", node_of(geometry))
    assert sorted(targets) == list(range(8))
    assert all(t.devices == {"1g.10gb": want} for t in targets.values())


def test_non_mig_gpus_are_skipped_under_all(a100: MigGeometry) -> None:
    gpus = [*node_of(a100, 1), GpuFacts(1, "NVIDIA T4", 0x1EB810DE, None)]
    cfg = load_config(DEFAULT_CONFIG_FILE)
    assert list(resolve(cfg, "all-1g", gpus)) == [0]


def test_render_round_trips(a100: MigGeometry) -> None:
    targets = [
        GpuTarget(0, True, {"3g.20gb": 1, "1g.5gb": 2}),
        GpuTarget(1, False, {}),
        GpuTarget(2, True, {}),
    ]
    cfg = parse_config(render_config("current", targets), "export.yaml")
    assert resolve(cfg, "current", node_of(a100, 3)) == {t.index: t for t in targets}


def test_hooks_file() -> None:
    hooks = parse_hooks(
        textwrap.dedent(
            """
            version: v1
            hooks:
              pre-apply-config:
                - command: /bin/sh
                  args: ["-c", "systemctl stop kubelet"]
                  envs: {A: "1"}
                  workdir: /tmp
              apply-exit:
                - command: /bin/true
            """
        )
    )
    assert hooks.hooks["pre-apply-config"][0].args == ("-c", "systemctl stop kubelet")
    assert hooks.hooks["pre-apply-config"][0].envs == {"A": "1"}
    assert hooks.hooks["apply-exit"][0].command == "/bin/true"


def test_hooks_errors() -> None:
    with pytest.raises(ConfigError) as err:
        parse_hooks(
            "version: v1\nhooks:\n  before-apply:\n    - command: x\n  apply-exit:\n"
            "    - args: [1]\n",
            "hooks.yaml",
        )
    text = [str(p) for p in err.value.problems]
    assert text[0].startswith(
        "hooks.yaml:3: hooks.before-apply: unknown field (known: apply-exit, apply-start"
    )
    assert text[1] == "hooks.yaml:6: hooks.apply-exit[0].command: required field is missing"


@pytest.mark.parametrize(
    ("hook", "says"),
    [
        ('{command: x, envs: {"A=B": "1"}}', "envs: 'A=B' is not an environment variable name"),
        ('{command: x, envs: {"": "1"}}', "envs: '' is not an environment variable name"),
        ('{command: x, envs: {A: "a\\0b"}}', "envs: the value of A contains a NUL character"),
        ('{command: x, args: [ok, "a\\0b"]}', "args: argument 1 contains a NUL character"),
        ('{command: "x\\0y"}', "command: must not contain a NUL character"),
    ],
)
def test_a_hook_the_system_would_refuse_to_run_is_refused_when_read(hook: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_hooks(f"version: v1\nhooks:\n  apply-start:\n    - {hook}\n", "hooks.yaml")
    assert [str(p) for p in err.value.problems] == [f"hooks.yaml:4: hooks.apply-start[0].{says}"]
