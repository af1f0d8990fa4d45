"""The catalogue: one description, three ways in, the same names, defaults and bounds."""

from __future__ import annotations

import re
import shlex
import textwrap
from pathlib import Path
from typing import Any

import pytest

from hetero.core import catalogue
from hetero.core.balancer import POLICIES
from hetero.core.catalogue import BY_NAME, OPTIONS, Entry, TrainingOptions
from hetero.core.catalogue import reference as ref_docs
from hetero.core.catalogue.commandline import argv_for, option_texts
from hetero.core.catalogue.keywords import from_keywords, init_keywords
from hetero.core.catalogue.kinds import Bool, Choice, Float, Int
from hetero.core.errors import ConfigError
from hetero.core.jobspec import load_jobspec, parse_jobspec
from hetero.trainer.cli import DESCRIPTION, EPILOG
from hetero.trainer.datasets import BUILT
from hetero.trainer.models import BUILDERS
from hetero.trainer.models.transformer import CONFIGS

REPO = Path(__file__).resolve().parents[2]

#: A value other than the default for every option, valid with its companions: a new
#: option must get one here, and is then checked all the ways it declares.
SAMPLES: dict[str, tuple[Any, dict[str, Any]]] = {
    "name": ("run-7", {}),
    "model": ("resnet18", {}),
    "dataset": ("imagefolder", {"data_dir": "/tmp/images"}),
    "data_dir": ("/tmp/cifar", {"dataset": "cifar10"}),
    "num_samples": (4096, {}),
    "num_classes": (100, {}),
    "image_size": (64, {}),
    "seq_len": (32, {"model": "gpt2-tiny"}),
    "num_workers": (2, {}),
    "eval_samples": (0, {}),
    "eval_every": (50, {}),
    "top": (True, {"output_dir": "/tmp/run"}),
    "global_batch": (512, {}),
    "batch_size": (64, {}),
    "steps": (1000, {}),
    "epochs": (3, {}),
    "lr": (0.001, {}),
    "optimizer": ("adamw", {}),
    "seed": (2**40, {}),
    "amp": ("bf16", {}),
    "channels_last": (True, {}),
    "zero": (True, {}),
    "shard": ("full", {}),
    "pipeline": (2, {"model": "gpt2-tiny"}),
    "offload": ("params", {"shard": "grad_op"}),
    "activation_checkpointing": ("on", {"model": "resnet18"}),
    "sync_batchnorm": (True, {}),
    "max_batch": ("64,-", {}),
    "memory_caps": (False, {}),
    "memory_probe": (False, {}),
    "memory_margin": (0.25, {}),
    "oom_retry": (True, {}),
    "memory_fraction": ("0.5", {}),
    "simulate_nodes": (2, {}),
    "policy": ("hybrid", {}),
    "rebalance_interval": (25, {}),
    "min_batch": (4, {}),
    "compute_scores": ("2,1", {}),
    "gpu_profiles": ("/tmp/profiles.json", {}),
    "emulate_slowdown": ("1:2", {}),
    "warmup_steps": (3, {}),
    "settle_steps": (2, {}),
    "history_intervals": (16, {}),
    "collective_timeout_s": (120.0, {}),
    "nproc": (2, {}),
    "device": ("cpu", {}),
    "comm": ("deferred", {}),
    "backend": ("gloo", {}),
    "output_dir": ("/tmp/out", {}),
    "tensorboard": ("/tmp/tb", {}),
    "checkpoint_dir": ("/tmp/ckpt", {}),
    "checkpoint_interval": (50, {"checkpoint_dir": "/tmp/ckpt"}),
    "resume": ("auto", {"checkpoint_dir": "/tmp/ckpt"}),
    "ideal_steps": (0, {}),
    "quiet": (True, {}),
    "summary_json": ("/tmp/s.json", {}),
    "json": (True, {}),
}


def _parser():  # type: ignore[no-untyped-def]
    from hetero.core.catalogue.commandline import build_parser

    return build_parser("hetero-train", DESCRIPTION, EPILOG)


def _cli(*argv: str) -> TrainingOptions:
    from hetero.core.catalogue.commandline import options_from_args

    return options_from_args(_parser().parse_args(list(argv)))


def _yaml_line(key: str, value: Any) -> str:
    if "." in key:
        outer, inner = key.split(".")
        return f"{outer}: {{{inner}: {_yaml_scalar(value)}}}"
    return f"{key}: {_yaml_scalar(value)}"


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, str) else str(value)


def _yaml(values: dict[str, Any]) -> str:
    """A job file setting ``values`` (catalogue names); the checkpoint keys share a mapping."""
    lines = ["resources: {ranks: 2}"]
    checkpoint = {}
    for name, value in values.items():
        key = BY_NAME[name].key
        if key.startswith("checkpoint."):
            checkpoint[key.split(".")[1]] = _yaml_scalar(value)
        else:
            lines.append(_yaml_line(key, value))
    if checkpoint:
        lines.append("checkpoint: {" + ", ".join(f"{k}: {v}" for k, v in checkpoint.items()) + "}")
    if "name" not in values:
        lines.append("name: x")
    return "\n".join(lines) + "\n"


def _flags(values: dict[str, Any]) -> list[str]:
    return argv_for({n: BY_NAME[n].to_text(v) for n, v in values.items()})


# ---- the catalogue and its implementations ---------------------------------------------


@pytest.mark.parametrize("entry", catalogue.MODELS, ids=lambda m: m.name)
def test_the_catalogues_parameter_counts_are_the_trainers_models(entry: Any) -> None:
    import torch

    from hetero.trainer.models import build_model

    with torch.device("meta"):  # shapes without storage or initialisation: counts alone
        built = build_model(entry.name, 10, None)
    assert sum(p.numel() for p in built.parameters()) == entry.parameters


@pytest.mark.parametrize("entry", catalogue.MODELS, ids=lambda m: m.name)
def test_the_catalogues_training_flops_are_the_trainers_models_forward_and_backward(
    entry: Any,
) -> None:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from hetero.trainer.models import build_model

    size = entry.default_size
    with torch.device("meta"):  # FLOPs are counted from shapes: no storage, no compute
        built = build_model(entry.name, 10, None)
        batch = (
            torch.randn(2, 3, size, size)
            if entry.kind == "image"
            else torch.randint(0, 100, (2, size))
        )
    with FlopCounterMode(display=False) as counter:
        built(batch).float().sum().backward()
    assert counter.get_total_flops() / 2 == pytest.approx(entry.train_flops, rel=0.01)


def test_the_trainer_implements_exactly_the_catalogues_models_datasets_and_policies() -> None:
    assert set(BUILDERS) == {m.name for m in catalogue.MODELS}
    assert set(BUILT) == {d.name for d in catalogue.DATASETS}
    assert set(POLICIES) == {p.name for p in catalogue.POLICIES}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_catalogue_states_each_language_models_real_sizes(name: str) -> None:
    entry, config = catalogue.model(name), CONFIGS[name]
    assert (entry.kind, entry.default_size, entry.max_seq_len) == (
        "text",
        config.seq_len,
        config.max_seq_len,
    )
    assert entry.task == ("causal-lm" if config.causal else "masked-lm")


@pytest.mark.parametrize("name", ["debug", "simple_cnn", "resnet18"])
def test_the_catalogue_states_whether_an_image_model_has_batchnorm(name: str) -> None:
    from torch import nn

    entry = catalogue.model(name)
    built = BUILDERS[name](10, entry.default_size)
    assert entry.has_batchnorm == any(isinstance(m, nn.BatchNorm2d) for m in built.modules())


# ---- one description, three ways in ---------------------------------------------------


def test_every_option_has_a_sample_and_a_reason_wherever_it_is_missing() -> None:
    assert set(SAMPLES) == {o.name for o in OPTIONS}
    for o in OPTIONS:
        assert (o.where == frozenset(Entry)) == (not o.absent), o.name
        assert o.help and o.group
        assert o.flag == "--" + o.name.replace("_", "-")  # the agent's argv relies on it


def test_the_defaults_are_the_same_three_ways() -> None:
    defaults = TrainingOptions()
    assert _cli() == defaults
    assert from_keywords({}) == defaults
    spec = parse_jobspec("name: x\nresources: {ranks: 2}\n")
    assert spec.options == defaults.replace(name="x")
    assert (spec.model, spec.dataset, spec.global_batch, spec.steps) == (
        "simple_cnn",
        "synthetic",
        96,
        100,
    )
    assert spec.rebalance_interval == defaults.rebalance_interval == 10
    assert spec.lr == 0.05 and spec.collective_timeout_s == 60.0


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_each_option_gives_the_same_value_every_way_it_is_offered(name: str) -> None:
    option = BY_NAME[name]
    value, companions = SAMPLES[name]
    values = {**companions, name: value}
    expected = getattr(TrainingOptions(**values), name)
    assert expected != option.default
    if Entry.CLI in option.where:
        assert getattr(_cli(*_flags(values)), name) == expected
    if Entry.API in option.where:
        assert getattr(from_keywords(values), name) == expected
    if option.init:
        init_values = {n: v for n, v in values.items() if BY_NAME[n].init}
        assert init_keywords(init_values)[name] == expected
    if Entry.YAML in option.where:
        yaml_values = values if name != "emulate_slowdown" else {}
        if yaml_values:
            spec = parse_jobspec(_yaml(yaml_values))
            assert getattr(spec.options, name) == expected
    else:
        with pytest.raises(ConfigError, match=r"unknown field"):
            parse_jobspec(_yaml({}) + _yaml_line(option.key, value) + "\n")


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_each_value_survives_the_text_the_launch_order_carries(name: str) -> None:
    value, companions = SAMPLES[name]
    options = TrainingOptions(**{**companions, name: value})
    texts = option_texts(options, [name, *companions])
    assert getattr(_cli(*argv_for(texts)), name) == getattr(options, name)


def _out_of_bounds(kind: Any) -> list[Any]:
    if isinstance(kind, Int):
        return [kind.minimum - 1, kind.maximum + 1]
    if isinstance(kind, Float):
        low = kind.above if kind.above is not None else kind.minimum
        high = kind.below if kind.below is not None else kind.maximum
        out = [] if low is None else [low - 1 if kind.above is None else low]
        return out + ([] if high is None else [high + (1 if kind.below is None else 0)])
    if isinstance(kind, Choice):
        return ["no-such-" + kind.choices[0]]
    if isinstance(kind, Bool):
        return ["maybe"]
    return []


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_a_bad_value_is_refused_with_the_same_words_naming_the_option_as_written(
    name: str,
) -> None:
    option = BY_NAME[name]
    companions = {n: v for n, v in SAMPLES[name][1].items() if n != "model"}
    for bad in _out_of_bounds(option.kind):
        messages = []
        if Entry.API in option.where:
            with pytest.raises(ConfigError) as info:
                from_keywords({name: bad})
            assert str(info.value).startswith(f"{name}: ")
            messages.append(str(info.value).split(": ", 1)[1])
        if Entry.CLI in option.where and not isinstance(option.kind, Bool):
            with pytest.raises(ConfigError) as info:
                _cli(f"{option.flag}={bad}")
            assert str(info.value).startswith(f"{option.flag}: ")
            messages.append(str(info.value).split(": ", 1)[1])
        if Entry.YAML in option.where and name != "emulate_slowdown":
            with pytest.raises(ConfigError) as info:
                parse_jobspec(_yaml({**companions, name: bad}))
            assert re.match(rf"job\.yaml:\d+: {re.escape(option.key)}: ", str(info.value))
            messages.append(str(info.value).split(f"{option.key}: ", 1)[1])
        assert len(set(messages)) <= 1, messages


def test_rules_between_options_name_them_in_the_callers_spelling() -> None:
    with pytest.raises(ConfigError, match=r"^--epochs: give either --steps or --epochs, not both$"):
        _cli("--steps", "3", "--epochs", "2")
    with pytest.raises(ConfigError, match=r"^epochs: give either steps or epochs, not both$"):
        from_keywords({"steps": 3, "epochs": 2})
    with pytest.raises(ConfigError, match=r"^job\.yaml:3: epochs: give either steps or epochs"):
        parse_jobspec("name: x\nsteps: 3\nepochs: 2\nresources: {ranks: 1}\n")
    with pytest.raises(ConfigError, match=r"^--seq-len: 100 exceeds gpt2-tiny's 64 positions$"):
        _cli("--model", "gpt2-tiny", "--seq-len", "100")
    with pytest.raises(ConfigError, match=r"needs a text dataset"):
        from_keywords({"model": "bert-tiny", "dataset": "cifar10", "data_dir": "/d"})


@pytest.mark.parametrize(
    ("given", "refused"),
    [
        ({"shard": "full", "zero": True}, r"^--zero: give either --shard or --zero"),
        ({"offload": "params"}, r"^--offload: needs --shard grad_op or full"),
        ({"shard": "full", "offload": "optimizer"}, r"^--offload: optimizer alone is not"),
        ({"shard": "grad_op", "comm": "overlap"}, r"^--comm: overlap schedules DDP's all-reduce"),
        ({"shard": "full", "amp": "fp16"}, r"^--amp: fp16 needs a gradient scaler"),
        ({"shard": "full", "oom_retry": True}, r"^--oom-retry: retries a step of replicated"),
    ],
)
def test_sharding_refuses_what_fsdp2_cannot_do_in_one_line(
    given: dict[str, Any], refused: str
) -> None:
    with pytest.raises(ConfigError, match=refused) as info:
        _cli(*_flags(given))
    assert "\n" not in str(info.value)
    _cli("--shard", "full", "--offload", "params", "--amp", "bf16")  # what it can do


@pytest.mark.parametrize(
    ("given", "refused"),
    [
        ({"pipeline": 2, "shard": "full"}, r"^--shard: not with --pipeline: --shard shards every"),
        ({"pipeline": 2, "zero": True}, r"^--zero: not with --pipeline"),
        ({"pipeline": 2, "comm": "overlap"}, r"^--comm: not with --pipeline"),
        ({"pipeline": 2, "amp": "bf16"}, r"^--amp: not with --pipeline"),
        ({"pipeline": 2, "max_batch": "8"}, r"^--max-batch: not with --pipeline"),
        ({"pipeline": 2, "eval_samples": 64}, r"^--eval-samples: not with --pipeline"),
    ],
)
def test_a_pipeline_refuses_what_its_stages_cannot_do_in_one_line(
    given: dict[str, Any], refused: str
) -> None:
    with pytest.raises(ConfigError, match=refused) as info:
        _cli(*_flags({"model": "gpt2-tiny", **given}))
    assert "\n" not in str(info.value)
    assert _cli("--model", "bert-tiny", "--pipeline", "2").eval_samples_for(100) == 0


def test_a_pipeline_job_cuts_a_language_model_over_ranks_its_stages_divide() -> None:
    spec = parse_jobspec("name: x\nmodel: gpt2-tiny\npipeline: 2\nresources: {ranks: 4}\n")
    assert spec.options.pipeline == 2
    assert not spec.resources.allow_exclusion  # a replica needs every one of its stages
    for text, refused in [
        ("model: resnet18\npipeline: 2\nresources: {ranks: 2}", r":3: pipeline: cuts the built-in"),
        ("model: gpt2-tiny\npipeline: 3\nresources: {ranks: 4}", r":3: pipeline: 3 stages do not"),
        (
            "model: gpt2-tiny\npipeline: 2\nresources: {ranks: 2, allow_exclusion: true}",
            r"resources\.allow_exclusion: not with pipeline",
        ),
    ]:
        with pytest.raises(ConfigError, match=refused):
            parse_jobspec(f"name: x\n{text}\n")
    # ht.init takes it for a loop's own model: no built-in model to check.
    assert init_keywords({"pipeline": 2}) == {"pipeline": 2}


# ---- the origin documents' flags ---------------------------------------------------------


def test_the_origin_documents_flags_are_aliases() -> None:
    o = _cli(
        "--batch-size",
        "32",
        "--epochs",
        "3",
        "--experiment-name",
        "exp1",
        "--gpu-profiles",
        "/tmp/p.json",
        "--dataset",
        "synthetic_image",
        "--enable-load-balancing",
        "--load-balance-policy",
        "proportional",
    )
    assert (o.batch_size, o.epochs, o.name, o.gpu_profiles, o.dataset, o.policy) == (
        32,
        3,
        "exp1",
        "/tmp/p.json",
        "synthetic",
        "proportional",
    )
    assert o.global_batch_for(4) == 128 and o.run_dir == "runs/exp1"
    assert _cli("--load-balance-policy", "dynamic").policy == "equal"  # balancing off
    assert _cli("--enable-load-balancing").policy == "dynamic"
    with pytest.raises(
        ConfigError, match=r"^--batch-size: give either --global-batch or --batch-size"
    ):
        _cli("--batch-size", "8", "--global-batch", "64")
    with pytest.raises(ConfigError, match=r"^--policy: give either --policy or --load-balance"):
        _cli("--policy", "equal", "--enable-load-balancing", "--load-balance-policy", "hybrid")
    with pytest.raises(ConfigError, match=r"^--experiment-name: must be 1-64 letters"):
        _cli("--experiment-name", "a b")
    spec = parse_jobspec(
        "name: x\nbatch_size: 16\ndataset: synthetic_image\nresources: {ranks: 3}\n"
    )
    assert (spec.global_batch, spec.dataset) == (48, "synthetic")


def test_unknown_names_get_a_hint_every_way_in(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _parser().parse_args(["--polcy", "equal"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert "unrecognized arguments: --polcy" in err and "did you mean --policy?" in err
    with pytest.raises(
        ConfigError, match=r"^ht\.train\(\): unknown option 'polcy' \(did you mean 'policy'\?\)"
    ):
        from_keywords({"polcy": "equal"})
    with pytest.raises(ConfigError, match=r"ht\.init\(\): model describes a built-in job"):
        init_keywords({"model": "resnet50"})
    with pytest.raises(ConfigError, match=r"ht\.train\(\): nproc is not a Python option"):
        from_keywords({"nproc": 2})
    with pytest.raises(
        ConfigError, match=r"^job\.yaml:2: polcy: unknown field \(did you mean 'policy'\?\)"
    ):
        parse_jobspec("name: x\npolcy: equal\nresources: {ranks: 1}\n")


# ---- docs and examples -------------------------------------------------------------------


def test_the_committed_tables_are_the_catalogues() -> None:
    assert ref_docs.stale(REPO) == [], "run: python -m hetero.core.catalogue.reference --write"


def test_the_help_lists_every_command_line_option() -> None:
    text = _parser().format_help()
    for o in OPTIONS:
        assert (o.flag in text) == (Entry.CLI in o.where), o.name
    for flag in ("--experiment-name", "--enable-load-balancing", "--load-balance-policy"):
        assert flag in text


@pytest.mark.parametrize("path", sorted((REPO / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_the_example_job_files_parse(path: Path) -> None:
    assert load_jobspec(path).name


def test_the_readmes_hetero_train_example_parses() -> None:
    readme = (REPO / "README.md").read_text()
    block = re.search(r"```sh\n(\.venv/bin/hetero-train .*?)\n```", readme, re.S)
    assert block is not None
    argv = shlex.split(block.group(1).replace("\\\n", " "))[1:]
    options = _cli(*argv)
    assert options.nproc == 3 and options.emulate_slowdown == "1:2,2:3"


def test_a_full_job_file_reads_as_the_same_options_hetero_train_gets() -> None:
    text = textwrap.dedent(
        """\
        name: resnet50-bf16
        model: resnet50
        amp: bf16
        channels_last: true
        optimizer: sgd
        num_workers: 4
        image_size: 160
        batch_size: 64
        epochs: 2
        policy: hybrid
        max_batch: [128, "-"]
        resources: {ranks: 2, device: cuda}
        checkpoint: {dir: /tmp/ckpt}
        """
    )
    spec = parse_jobspec(text)
    assert spec.global_batch == 128 and spec.checkpoint is not None
    assert spec.checkpoint.interval_steps == 500 and spec.options.max_batch == "128,-"
    launched = _cli(*argv_for(spec.launch_options()))
    assert launched.replace(batch_size=None, global_batch=128) == spec.options.replace(
        batch_size=None, global_batch=128, checkpoint_interval=500
    )
