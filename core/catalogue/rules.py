"""The rules between training options, checked wherever a ``TrainingOptions`` is made.

Each rule raises an ``OptionError`` naming the option at fault (mentions of
other options go through ``ref`` so that ``hetero-train`` says ``--steps`` and
job.yaml says ``steps``). What can only be known once the job runs (the
dataset's real size, a rank's memory, the world size of a ``--max-batch``
list) is checked by the trainer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hetero.core.catalogue.entries import DATASETS, dataset, model
from hetero.core.catalogue.options import OptionError, ref

if TYPE_CHECKING:
    from hetero.core.catalogue.training import TrainingOptions

_TEXT_DATASETS = ", ".join(d.name for d in DATASETS if d.kind == "text")
_FILE_DATASETS = ", ".join(d.name for d in DATASETS if d.needs_data_dir)


def check_rules(o: TrainingOptions) -> None:
    """Raise the first broken rule as an ``OptionError``."""
    _exclusive(o)
    _workload(o)
    _sharding(o)
    _pipeline(o)
    _outputs(o)
    if o.simulate_nodes == 1:
        raise OptionError("simulate_nodes", "needs at least 2 nodes")
    if o.simulate_nodes and o.nproc not in (1, o.simulate_nodes):
        raise OptionError(
            "nproc", f"leave out {ref('nproc')}: {ref('simulate_nodes')} N starts N ranks itself"
        )


def _exclusive(o: TrainingOptions) -> None:
    for first, second, why in (
        ("steps", "epochs", ""),
        ("global_batch", "batch_size", f" ({ref('batch_size')} is per rank)"),
        ("compute_scores", "gpu_profiles", " (the profiles carry the scores)"),
    ):
        if getattr(o, first) is not None and getattr(o, second) is not None:
            raise OptionError(second, f"give either {ref(first)} or {ref(second)}, not both{why}")


def _workload(o: TrainingOptions) -> None:
    m = model(o.model)
    assert o.dataset is not None  # TrainingOptions fills it in before the rules run
    d = dataset(o.dataset)
    if m.kind != d.kind:
        wanted = f"a text dataset ({_TEXT_DATASETS})" if m.kind == "text" else "an image dataset"
        raise OptionError("dataset", f"model {m.name} needs {wanted}, not {d.name!r}")
    if d.needs_data_dir and o.data_dir is None:
        raise OptionError(
            "data_dir", f"required when {ref('dataset')} is {d.name}", anchor="dataset"
        )
    if not d.needs_data_dir and o.data_dir is not None:
        raise OptionError(
            "data_dir", f"only used with the datasets read from files ({_FILE_DATASETS})"
        )
    # image_size and channels_last mean nothing to a language model, nor seq_len to an
    # image model: they are ignored there (the summary says what applied), as scenario
    # files that set them for every model expect.
    limit = m.max_seq_len if m.kind == "text" else None
    if o.seq_len is not None and limit is not None and o.seq_len > limit:
        raise OptionError("seq_len", f"{o.seq_len} exceeds {m.name}'s {limit} positions")


def _sharding(o: TrainingOptions) -> None:
    """What FSDP2 (``shard``) and its offload combine with."""
    if o.offload == "optimizer":
        raise OptionError(
            "offload",
            "optimizer alone is not available: FSDP2 offloads the sharded parameters, "
            "gradients and optimizer state together (params)",
        )
    if o.shard == "none":
        if o.offload != "none":
            raise OptionError("offload", f"needs {ref('shard')} grad_op or full (FSDP2 offloads)")
        return
    if o.zero:
        raise OptionError(
            "zero",
            f"give either {ref('shard')} or {ref('zero')}: shard already shards the "
            "optimizer state",
        )
    if o.comm != "auto":
        raise OptionError(
            "comm",
            f"{o.comm} schedules DDP's all-reduce; with {ref('shard')} FSDP2 schedules "
            "its own reduce-scatters",
        )
    if o.amp == "fp16":
        raise OptionError(
            "amp", f"fp16 needs a gradient scaler FSDP2 lacks here; with {ref('shard')} use bf16"
        )
    if o.oom_retry:
        raise OptionError(
            "oom_retry", f"retries a step of replicated DDP, not of {ref('shard')} (FSDP2)"
        )


#: What a pipeline (``pipeline`` > 1) does not combine with, and why.
_NOT_WITH_PIPELINE = (
    ("shard", "none", "shards every layer over the ranks; pipeline stages split the layers"),
    ("zero", False, "shards the optimizer state of replicated data parallelism"),
    ("oom_retry", False, "retries a step of replicated data parallelism"),
    ("sync_batchnorm", False, "is for the image models, which are not cut into stages"),
    ("comm", "auto", "schedules DDP's all-reduce; a stage sums its gradients after its schedule"),
    ("amp", "none", "autocast is not applied inside the stages yet"),
    ("max_batch", None, "caps each rank's batch; a replica's share is planned in microbatches"),
    ("simulate_nodes", 0, "shares one device; a pipeline's stages need a device each"),
    ("eval_every", None, "evaluates on rank 0, which holds the first stage alone"),
)


def pipeline_model(o: TrainingOptions) -> None:
    """A built-in job's pipeline cuts a built-in language model (gpt2-*, bert-*). Not among
    :func:`check_rules`: ``ht.init``'s options hold no model (a training loop's own model
    is checked when ``ctx.wrap`` cuts it); the job's entry points call it."""
    m = model(o.model)
    if o.pipeline > 1 and m.kind != "text":
        raise OptionError(
            "pipeline",
            f"cuts the built-in language models (gpt2-*, bert-*) at their blocks, not {m.name}",
        )


def _pipeline(o: TrainingOptions) -> None:
    """What pipeline stages (``pipeline`` > 1) combine with: none of the data-parallel
    path's own devices."""
    if o.pipeline == 1:
        return
    for name, plain, why in _NOT_WITH_PIPELINE:
        if getattr(o, name) != plain:
            raise OptionError(name, f"not with {ref('pipeline')}: {ref(name)} {why}")
    if o.eval_samples:
        raise OptionError(
            "eval_samples",
            f"not with {ref('pipeline')}: evaluation runs on rank 0, which holds the first "
            "stage alone",
        )


def _outputs(o: TrainingOptions) -> None:
    if o.top and o.run_dir is None:
        raise OptionError("top", f"needs {ref('output_dir')} or {ref('name')} (the run it shows)")
    if o.eval_every is not None and o.eval_samples == 0:
        raise OptionError("eval_every", f"needs {ref('eval_samples')} above 0")
    if o.checkpoint_interval and o.checkpoint_file is None:
        raise OptionError(
            "checkpoint_interval", f"needs {ref('checkpoint_dir')} or {ref('output_dir')}"
        )
    if o.resume == "auto" and o.checkpoint_file is None:
        raise OptionError("resume", f"auto needs {ref('checkpoint_dir')} or {ref('output_dir')}")
