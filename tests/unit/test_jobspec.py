"""job.yaml parsing: typed result, and every error names the file, line and field."""

from __future__ import annotations

import textwrap

import pytest

from hetero.core.errors import ConfigError
from hetero.core.jobspec import JobSpec, parse_jobspec

GOOD = """\
name: demo
model: simple_cnn
dataset: synthetic
global_batch: 96
steps: 200
policy: dynamic
rebalance_interval: 10
resources:
  ranks: 3
  allow_cpu: true
checkpoint:
  dir: /tmp/ckpt
  interval_steps: 50
emulate_slowdown: {1: 2.0, 2: 3}
lr: 0.05
seed: 7
"""


def _error(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_jobspec(textwrap.dedent(text), source="job.yaml")
    return str(info.value)


def test_a_full_spec_parses_into_frozen_typed_fields() -> None:
    spec = parse_jobspec(GOOD)
    assert isinstance(spec, JobSpec)
    assert (spec.name, spec.model, spec.dataset, spec.global_batch) == (
        "demo",
        "simple_cnn",
        "synthetic",
        96,
    )
    assert spec.world_size == 3 and spec.resources.allow_cpu
    assert spec.emulate_slowdown == (1.0, 2.0, 3.0) and spec.emulated
    assert spec.checkpoint is not None and spec.checkpoint.interval_steps == 50
    assert (spec.steps, spec.epochs, spec.lr, spec.seed) == (200, None, 0.05, 7)
    with pytest.raises(AttributeError):
        spec.name = "other"  # type: ignore[misc]


def test_defaults_are_dynamic_policy_synthetic_data_and_no_emulation() -> None:
    spec = parse_jobspec(
        "name: x\nmodel: debug\nglobal_batch: 8\nepochs: 1\nresources: {ranks: 2}\n"
    )
    assert spec.policy == "dynamic" and spec.dataset == "synthetic"
    assert spec.emulate_slowdown == (1.0, 1.0) and not spec.emulated


def test_command_jobs_take_a_string_or_an_argument_list() -> None:
    base = "name: x\nglobal_batch: 8\nsteps: 5\nresources: {ranks: 2}\n"
    spec = parse_jobspec(base + "command: python train.py --lr '0.1'\n")
    assert spec.command == ("python", "train.py", "--lr", "0.1") and spec.model is None
    spec = parse_jobspec(base + "command: [python, train.py, --epochs, 3]\n")
    assert spec.command == ("python", "train.py", "--epochs", "3")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("global_batch: 0", "job.yaml:4: global_batch: must be >= 1, got 0"),
        ("globl_batch: 8", "job.yaml:4: globl_batch: unknown field (did you mean 'global_batch'?)"),
        (
            "policy: dinamic",
            "job.yaml:4: policy: unknown value 'dinamic' (did you mean 'dynamic'?)",
        ),
        (
            "model: resnet51",
            "job.yaml:4: model: unknown value 'resnet51' (did you mean 'resnet50'?)",
        ),
        ("rebalance_interval: -5", "job.yaml:4: rebalance_interval: must be >= 1, got -5"),
        ("lr: .nan", "job.yaml:4: lr: must be finite"),
        ("epochs: 2", "job.yaml:4: epochs: give either steps or epochs, not both"),
        ("emulate_slowdown: [1, 0.5]", "job.yaml:4: emulate_slowdown[1]: must be >= 1, got 0.5"),
        ("emulate_slowdown: {5: 2}", "job.yaml:4: emulate_slowdown: rank 5 is not in 0..1"),
        ("dataset: imagefolder", "job.yaml:4: data_dir: required when dataset is imagefolder"),
        ("command: python x.py", "job.yaml:1: model: not allowed with command:"),
        ("seed: true", "job.yaml:4: seed: must be a whole number, got True"),
    ],
)
def test_bad_values_name_the_field_and_the_line(text: str, expected: str) -> None:
    key = text.split(":")[0]
    # Lines 1-3 hold valid defaults; the line under test is line 4 and replaces its default.
    base = ["model: debug", "global_batch: 8", "steps: 5"]
    lines = [line if line.split(":")[0] != key else "# replaced" for line in base]
    doc = "\n".join([*lines, text, "name: x", "resources: {ranks: 2}"]) + "\n"
    assert _error(doc).startswith(expected)


def test_duplicate_keys_are_errors_not_silent_overrides() -> None:
    doc = "name: x\nmodel: debug\nsteps: 5\nsteps: 10\nglobal_batch: 8\nresources: {ranks: 1}\n"
    assert _error(doc) == "job.yaml:4: steps: duplicate key (first on line 3)"


def test_nested_unknown_keys_are_named_with_their_path() -> None:
    msg = _error(
        """\
        name: x
        model: debug
        global_batch: 8
        steps: 5
        resources:
          ranks: 2
          alow_cpu: false
        """
    )
    assert msg == "job.yaml:7: resources.alow_cpu: unknown field (did you mean 'allow_cpu'?)"


def test_missing_required_fields_and_impossible_batches_are_rejected() -> None:
    assert "resources: required" in _error("name: x\nmodel: debug\nglobal_batch: 8\nsteps: 1\n")
    assert _error("model: debug\nresources: {ranks: 1}\n") == "job.yaml:1: name: required"
    msg = _error("name: x\nmodel: debug\nglobal_batch: 2\nsteps: 1\nresources: {ranks: 3}\n")
    assert msg == "job.yaml:3: global_batch: 2 is smaller than min_batch 1 x 3 ranks"


def test_yaml_syntax_errors_and_non_mappings_carry_a_line() -> None:
    assert _error("name: x\nresources: [\n").startswith("job.yaml:3: not valid YAML")
    assert _error("- a\n- b\n") == "job.yaml:1: the document must be a mapping of keys to values"
    assert _error("") == "job.yaml: empty document"


def test_allow_exclusion_is_on_for_built_in_jobs_and_off_for_commands_unless_given() -> None:
    builtin = "name: a\nmodel: debug\nresources: {ranks: 2}\n"
    command = "name: a\ncommand: python train.py\nresources: {ranks: 2}\n"
    assert parse_jobspec(builtin).resources.allow_exclusion is True
    assert parse_jobspec(command).resources.allow_exclusion is False
    opt_in = command.replace("ranks: 2}", "ranks: 2, allow_exclusion: true}")
    assert parse_jobspec(opt_in).resources.allow_exclusion is True
    opt_out = builtin.replace("ranks: 2}", "ranks: 2, allow_exclusion: false}")
    assert parse_jobspec(opt_out).resources.allow_exclusion is False
    with pytest.raises(ConfigError, match="allow_exclusion: must be true or false"):
        parse_jobspec(builtin.replace("ranks: 2}", "ranks: 2, allow_exclusion: maybe}"))
