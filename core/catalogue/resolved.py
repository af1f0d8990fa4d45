"""What the options' defaults of ``None`` become once a job runs: ``Resolved``.

Mixed into ``TrainingOptions`` (``training.py``), which declares the fields;
kept apart so that the catalogue of options reads as one list and the rules
that complete it as another.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from hetero.core.catalogue import limits
from hetero.core.catalogue.entries import model as model_entry


class Resolved:
    """The derived values of a training configuration (see the module doc)."""

    if TYPE_CHECKING:  # the fields, declared by TrainingOptions
        name: str | None
        model: str
        global_batch: int | None
        eval_samples: int | None
        pipeline: int
        batch_size: int | None
        steps: int | None
        epochs: int | None
        lr: float | None
        optimizer: str
        output_dir: str | None
        checkpoint_dir: str | None
        checkpoint_interval: int | None

    def global_batch_for(self, world_size: int) -> int:
        """Samples per step over ``world_size`` ranks."""
        if self.global_batch is not None:
            return self.global_batch
        if self.batch_size is not None:
            return self.batch_size * world_size
        return limits.DEFAULT_GLOBAL_BATCH

    def eval_samples_for(self, trained_samples: int) -> int:
        """Samples to score, for a run of ``trained_samples`` (steps × global batch): the
        option if given, else as many, at most ``DEFAULT_EVAL_SAMPLES``. Proportionate: a
        two-step smoke test is not held up scoring 512 samples of a large model."""
        if self.eval_samples is not None:
            return self.eval_samples
        if self.pipeline > 1:  # rank 0 holds the first stage alone: nothing to score with
            return 0
        return min(limits.DEFAULT_EVAL_SAMPLES, max(trained_samples, 1))

    def steps_for(self, steps_per_epoch: int) -> int:
        """Optimizer steps in total, given the dataset's steps per epoch."""
        if self.steps is not None:
            return self.steps
        if self.epochs is not None:
            return self.epochs * max(steps_per_epoch, 1)
        return limits.DEFAULT_STEPS

    @property
    def run_dir(self) -> str | None:
        """Where the run writes: ``output_dir``, else ``runs/NAME`` for a named run."""
        if self.output_dir is not None:
            return self.output_dir
        return str(PurePosixPath("runs") / self.name) if self.name else None

    @property
    def checkpoint_every(self) -> int:
        """Steps between checkpoints (0: none)."""
        if self.checkpoint_interval is not None:
            return self.checkpoint_interval
        return limits.DEFAULT_CHECKPOINT_INTERVAL if self.checkpoint_dir else 0

    @property
    def checkpoint_file(self) -> str | None:
        """``CHECKPOINT_DIR/last.pt`` (default ``RUN_DIR/checkpoints``), or None without either."""
        run = self.run_dir
        base = self.checkpoint_dir or (str(PurePosixPath(run) / "checkpoints") if run else None)
        return str(PurePosixPath(base) / "last.pt") if base else None

    @property
    def optimizer_kind(self) -> str:
        """``sgd`` or ``adamw``: ``auto`` is AdamW for language models, SGD otherwise."""
        if self.optimizer != "auto":
            return self.optimizer
        return "adamw" if model_entry(self.model).kind == "text" else "sgd"

    def learning_rate(self, optimizer: str) -> float:
        """``lr``, else the default of ``optimizer`` (``sgd`` or ``adamw``)."""
        if self.lr is not None:
            return self.lr
        return limits.SGD_LR if optimizer == "sgd" else limits.ADAMW_LR
