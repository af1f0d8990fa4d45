"""Every training option, described once: ``TrainingOptions``.

Each field is an option (``hetero.core.catalogue.options.opt``): its kind and
bounds, default, help, group, and the entry points that take it. From this one
class come ``hetero-train``'s flags and ``--help``, job.yaml's keys, the
keywords of ``ht.train`` and ``ht.init``, the launch order's option map and the
tables of ``docs/jobspec.md``. An instance is a validated configuration:
constructing one checks every value and the rules between them, and an error
is an ``OptionError`` that each entry point words in its own spelling.

The module is over the usual ~450 lines because it is one list: a field per option,
each with its help text; splitting it by option group would put the rules between
options (``rules.py``) a module away from half of what they relate.

A default of ``None`` is one decided when the job runs (the model's image
size, 96 samples or ``batch_size`` × ranks, ...); ``default_doc`` says which.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from hetero.core import defaults
from hetero.core.catalogue import limits
from hetero.core.catalogue.entries import (
    DATASET_ALIASES,
    DATASET_NAMES,
    MODEL_NAMES,
    POLICY_NAMES,
    default_dataset,
)
from hetero.core.catalogue.kinds import (
    Bool,
    Choice,
    Float,
    Int,
    ListKind,
    PathKind,
    Slowdowns,
    Switch,
    Text,
    cap_item,
    fraction_item,
    score_item,
)
from hetero.core.catalogue.options import Entry, Option, described, opt, ref
from hetero.core.catalogue.resolved import Resolved

CLI = frozenset({Entry.CLI})
CLI_API = frozenset({Entry.CLI, Entry.API})
_PLACED = "the coordinator plans a job.yaml job from the profiles its agents measured"


@dataclass(frozen=True)
class TrainingOptions(Resolved):
    """A built-in training job's options, validated on construction (see the module doc)."""

    # ---- the job ---------------------------------------------------------------------------
    name: str | None = opt(
        None,
        Text(
            limits.NAME_PATTERN,
            "1-64 letters, digits, '.', '_' or '-'",
            "1–64 of `A-Z a-z 0-9 . _ -`",
            "NAME",
        ),
        "names the run: its summary, its metrics and the default output directory runs/NAME",
        "job",
        aliases=("--experiment-name",),
        yaml_note="the job's name in `hetero-coord jobs`",
        yaml_default="required",
    )
    model: str = opt("simple_cnn", Choice(MODEL_NAMES), "built-in model (docs/models.md)", "job")
    dataset: str | None = opt(
        None,
        Choice(DATASET_NAMES, DATASET_ALIASES),
        "built-in dataset (`synthetic_image` is `synthetic`)",
        "job",
        default_doc="`synthetic` for image models, `synthetic-text` for language models",
    )
    data_dir: str | None = opt(
        None,
        PathKind(),
        "imagefolder: its root; cifar10/cifar100: the folder of the python batches; text: a "
        "file or a folder of *.txt",
        "job",
        yaml_note="an absolute path under an allowed root",
    )
    num_samples: int = opt(
        8192, Int(1, 10**9), "samples per epoch of the synthetic datasets", "job"
    )
    num_classes: int = opt(
        10, Int(1, 10**6), "classes of the synthetic images (other datasets bring their own)", "job"
    )
    image_size: int | None = opt(
        None,
        Int(1, 4096, "pixels"),
        "pixels per side (image models)",
        "job",
        default_doc="the model's",
    )
    seq_len: int | None = opt(
        None,
        Int(1, 10**6, "tokens"),
        "tokens per sample (language models)",
        "job",
        default_doc="the model's",
    )
    num_workers: int = opt(
        0,
        Int(0, 256),
        "DataLoader worker processes per rank, as plain DDP runs them: the same count for "
        "the whole run, whatever the plan",
        "job",
    )
    eval_samples: int | None = opt(
        None,
        Int(0, 10**9),
        "samples rank 0 scores after training (CIFAR: its test split); 0: none",
        "job",
        default_doc=f"the samples the run trains on (steps × global batch), at most "
        f"{limits.DEFAULT_EVAL_SAMPLES}: a short run is not held up by its evaluation",
    )
    eval_every: int | None = opt(
        None,
        Int(1, limits.MAX_INTERVAL_STEPS, "steps"),
        f"also score {ref('eval_samples')} samples every this many steps during training "
        "(eval loss and accuracy curves in the run's metrics and TensorBoard)",
        "job",
        default_doc="after training only",
    )

    # ---- length and batch ------------------------------------------------------------------
    global_batch: int | None = opt(
        None,
        Int(1, limits.MAX_GLOBAL_BATCH, "samples"),
        "samples per step over all ranks; never changes when the plan does",
        "length",
        default_doc=f"{limits.DEFAULT_GLOBAL_BATCH}, or {ref('batch_size')} × ranks",
    )
    batch_size: int | None = opt(
        None,
        Int(1, limits.MAX_GLOBAL_BATCH, "samples"),
        f"per-rank base batch: the global batch is this × ranks; excludes {ref('global_batch')}",
        "length",
    )
    steps: int | None = opt(
        None,
        Int(1, limits.MAX_STEPS),
        f"optimizer steps in total; excludes {ref('epochs')}",
        "length",
        default_doc=f"{limits.DEFAULT_STEPS} without {ref('epochs')}",
    )
    epochs: int | None = opt(
        None,
        Int(1, limits.MAX_EPOCHS),
        f"passes over the dataset, counted from its real size once built; excludes {ref('steps')}",
        "length",
        aliases=("--num-epochs",),
    )
    lr: float | None = opt(
        None,
        Float(above=0.0, maximum=1e3),
        "learning rate",
        "length",
        default_doc=f"{limits.SGD_LR:g} for SGD, {limits.ADAMW_LR:g} for AdamW",
    )
    optimizer: str = opt(
        "auto",
        Choice(limits.OPTIMIZERS),
        "auto: SGD with momentum for image models, AdamW for language models",
        "length",
    )
    seed: int = opt(
        0, Int(0, limits.MAX_SEED), "seed of the model's init and the data order", "length"
    )

    # ---- precision and memory --------------------------------------------------------------
    amp: str = opt(
        "none",
        Choice(limits.AMP_MODES),
        "autocast to bf16 or fp16 (fp16 with a gradient scaler)",
        "memory",
    )
    channels_last: bool = opt(
        False, Bool(), "model and inputs in the channels_last layout (image models)", "memory"
    )
    zero: bool = opt(False, Bool(), "shard the optimizer state over the ranks (ZeRO-1)", "memory")
    shard: str = opt(
        "none",
        Choice(limits.SHARD_MODES),
        "shard the training state over the ranks with PyTorch's FSDP2, batches still uneven: "
        "grad_op keeps parameters gathered from forward to backward (ZeRO-2-like), full "
        "re-gathers them in backward (ZeRO-3-like); none: replicated DDP",
        "memory",
        init=True,
    )
    offload: str = opt(
        "none",
        Choice(limits.OFFLOAD_MODES),
        "params: keep the sharded parameters, gradients and optimizer state in host memory "
        f"and step the optimizer there (FSDP2's CPUOffloadPolicy; needs {ref('shard')})",
        "memory",
        init=True,
    )
    pipeline: int = opt(
        1,
        Int(1, limits.MAX_RANKS, "stages"),
        "cut the model into this many pipeline stages, each rank a stage, the blocks sized "
        "to each rank's measured speed and memory; the ranks make replicas of the pipeline, "
        "which get uneven shares of the global batch (docs/models.md); 1: none",
        "memory",
        init=True,
    )
    activation_checkpointing: str = opt(
        "auto",
        Switch(),
        "recompute each block's activations in backward instead of keeping "
        "them (about a third more compute, far less activation memory); auto: on for a rank "
        "whose memory holds it below its share of the first plan (docs/models.md); on, off: "
        "every rank",
        "memory",
        init=True,
    )
    sync_batchnorm: bool = opt(
        False, Bool(), "BatchNorm over the whole global batch (CUDA ranks)", "memory"
    )
    max_batch: str | None = opt(
        None,
        ListKind(cap_item, "`N` or `N,N,...` (`-`: none)", "N|N,N,..."),
        "batch caps: one for every rank or one per rank",
        "memory",
    )
    memory_caps: bool = opt(
        True, Bool(), "measure each rank's memory and cap its batch to fit", "memory"
    )
    memory_probe: bool = opt(
        True,
        Bool(),
        "before step 0, measure each rank's peak at two small batches and cap its "
        f"first plan to fit (CUDA ranks; needs {ref('memory_caps')})",
        "memory",
    )
    memory_margin: float = opt(
        0.1, Float(minimum=0.0, below=1.0), "share of memory left free under a cap", "memory"
    )
    oom_retry: bool = opt(
        False,
        Bool(),
        "survive out-of-memory errors: shrink that rank's batch and retry the step",
        "memory",
    )
    memory_fraction: str | None = opt(
        None,
        ListKind(fraction_item, "`F` or `F0,F1,...`, each in (0, 1]", "F|F,F,..."),
        "cap each rank's CUDA allocator at this fraction of its device",
        "memory",
    )
    simulate_nodes: int = opt(
        0,
        Int(0, limits.MAX_RANKS),
        "N ranks on one GPU over Gloo, each a simulated node (docs/models.md)",
        "memory",
        where=CLI,
        absent="starts local processes, which only hetero-train does",
    )

    # ---- balancing -------------------------------------------------------------------------
    policy: str = opt(
        "dynamic",
        Choice(POLICY_NAMES),
        "balancer policy (docs/balancer.md)",
        "balancing",
        init=True,
    )
    rebalance_interval: int = opt(
        defaults.REBALANCE_INTERVAL_STEPS,
        Int(1, limits.MAX_INTERVAL_STEPS, "steps"),
        "steps between re-plans",
        "balancing",
        init=True,
    )
    min_batch: int = opt(
        1,
        Int(1, limits.MAX_GLOBAL_BATCH, "samples"),
        "smallest batch a plan gives a rank",
        "balancing",
        init=True,
    )
    compute_scores: str | None = opt(
        None,
        ListKind(score_item, "`S0,S1,...`, each > 0", "S0,S1,..."),
        "relative speed of each rank (e.g. solo samples/s), for proportional and hybrid",
        "balancing",
        where=CLI_API,
        absent=_PLACED,
        init=True,
    )
    gpu_profiles: str | None = opt(
        None,
        PathKind(),
        "JSON file: a list, in rank order, of {name, compute_score, memory_bytes}: the "
        f"compute scores of proportional and hybrid; excludes {ref('compute_scores')}",
        "balancing",
        where=CLI_API,
        absent=_PLACED,
        init=True,
    )
    emulate_slowdown: str | None = opt(
        None,
        Slowdowns(),
        "make ranks slower by an injected wait, e.g. 1:2,2:3@100-200 (every output says emulated)",
        "balancing",
        yaml_type="list (a factor per rank) or mapping `{rank: factor}`, each in [1, 100]",
        init=True,
    )
    warmup_steps: int = opt(
        1,
        Int(0, 10**6, "steps"),
        "first steps of a run left out of the measurements",
        "balancing",
        init=True,
    )
    settle_steps: int = opt(
        1,
        Int(0, 10**6, "steps"),
        "steps after a plan change left out of the measurements",
        "balancing",
        init=True,
    )
    history_intervals: int = opt(
        32, Int(1, 10**6), "intervals of statistics the planner keeps", "balancing", init=True
    )
    collective_timeout_s: float | None = opt(
        None,
        Float(above=0.0, maximum=86400.0, unit="seconds"),
        "seconds a collective waits for a peer before the rank fails (no hang on a dead peer)",
        "balancing",
        default_doc=f"{defaults.JOB_COLLECTIVE_TIMEOUT_S:g} in a coordinator's job, else "
        f"{defaults.COLLECTIVE_TIMEOUT_S:g}",
        init=True,
    )

    # ---- processes -------------------------------------------------------------------------
    nproc: int = opt(
        1,
        Int(1, limits.MAX_RANKS),
        "local ranks to start (Gloo on CPU, NCCL when every rank has a GPU)",
        "processes",
        where=CLI,
        absent="starts local processes; a coordinator's job has resources.ranks, ht.train "
        "runs in the calling process",
    )
    device: str = opt(
        "auto",
        Choice(limits.DEVICES),
        "auto: the rank's GPU if it has one, else the CPU",
        "processes",
        where=CLI_API,
        absent="job.yaml has resources.device, and the coordinator places each rank",
        init=True,
    )
    backend: str | None = opt(
        None,
        Choice(limits.BACKENDS),
        "process-group backend; a job mixing GPU and CPU ranks needs gloo",
        "processes",
        default_doc="nccl if this rank has a GPU, else gloo",
        where=CLI_API,
        absent="the coordinator picks NCCL only when every rank of a job is on CUDA",
        init=True,
    )
    comm: str = opt(
        "auto",
        Choice(limits.COMM_MODES),
        "when gradient all-reduces start: overlap (during backward), deferred (once the last "
        "bucket is ready), auto (deferred while planning, overlap kept if a trial interval "
        "is faster)",
        "processes",
        init=True,
    )

    # ---- output ----------------------------------------------------------------------------
    output_dir: str | None = opt(
        None,
        PathKind(),
        "metrics (JSON lines per rank), logs and checkpoints",
        "output",
        default_doc=f"runs/NAME when {ref('name')} is given",
        where=CLI_API,
        absent="each rank of a job.yaml job writes under its agent's state directory",
        init=True,
    )
    tensorboard: str | None = opt(
        None, PathKind(), "per-rank TensorBoard scalars here", "output", init=True
    )
    checkpoint_dir: str | None = opt(
        None,
        PathKind(),
        "where checkpoints go (a directory every rank's node sees)",
        "output",
        default_doc="OUTPUT_DIR/checkpoints (for resume; none are written without an interval)",
        yaml_key="checkpoint.dir",
        yaml_default="none: no checkpoints",
    )
    checkpoint_interval: int | None = opt(
        None,
        Int(1, limits.MAX_INTERVAL_STEPS, "steps"),
        "steps between checkpoints",
        "output",
        default_doc=f"{limits.DEFAULT_CHECKPOINT_INTERVAL} with {ref('checkpoint_dir')}, else none",
        yaml_key="checkpoint.interval_steps",
    )
    resume: str | None = opt(
        None,
        Text(words="path or `auto`", meta="PATH|auto"),
        "resume from a checkpoint ('auto': the last one, if any)",
        "output",
        where=CLI_API,
        absent="a restarted job.yaml job resumes from checkpoint.dir by itself",
    )
    ideal_steps: int = opt(
        8,
        Int(0, 10**6, "steps"),
        "steps per rank of the standalone (ideal) measurement after training, at most the "
        "steps the run trained; 0 skips it",
        "output",
    )
    quiet: bool = opt(False, Bool(), "no progress lines (the summary still prints)", "output")
    summary_json: str | None = opt(
        None,
        PathKind(),
        "write the run's summary here",
        "output",
        where=CLI,
        absent="ht.train returns the summary; an agent writes each rank's summary into its output directory",
    )
    top: bool = opt(
        False,
        Bool(),
        "show the run live in hetero-top's run view while it trains (its output goes to "
        "RUN_DIR/train.log; quitting the view stops the run)",
        "output",
        where=CLI,
        absent="hetero-top --run DIR follows any run's output directory",
    )
    json: bool = opt(
        False,
        Bool(),
        "print the summary as JSON instead of a table",
        "output",
        where=CLI,
        absent="ht.train returns the summary as a dict; an agent asks for JSON itself",
    )

    def __post_init__(self) -> None:
        from hetero.core.catalogue.rules import check_rules

        for option in OPTIONS:
            value = option.check(getattr(self, option.name))
            object.__setattr__(self, option.name, value)  # canonical form (aliases, paths)
        if self.dataset is None:
            object.__setattr__(self, "dataset", default_dataset(self.model))
        check_rules(self)

    def given(self) -> dict[str, Any]:
        """The options whose value differs from their default, by name."""
        return {
            o.name: getattr(self, o.name) for o in OPTIONS if getattr(self, o.name) != o.default
        }

    def replace(self, **changes: Any) -> TrainingOptions:
        return dataclasses.replace(self, **changes)


#: Every option, in declaration order.
OPTIONS: tuple[Option, ...] = described(TrainingOptions)
BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}
