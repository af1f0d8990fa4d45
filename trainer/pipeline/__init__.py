"""A model's repeated blocks as pipeline stages sized to unlike devices, and pipeline
replicas under hetero's uneven data parallelism.

The parts, each usable alone:

- :mod:`.profile`: each part of a model measured once on one device at the microbatch
  size (:func:`profile`), and each rank's device against the profiling one
  (:func:`speed_probe`);
- :func:`hetero.core.stages.partition` (pure) cuts the blocks where the devices' speeds
  and memory say, and :mod:`hetero.core.pipeplan` lays stages and replicas over the ranks;
- :mod:`.stage`: a rank's stage of the model (:class:`Stage` for the built-in language
  models, :func:`traced_stage` for any other model with repeated blocks) and the clock
  that times its own compute;
- :mod:`.pipe`: :func:`build` gives a rank its :class:`Pipe`: its stage, the
  ``torch.distributed.pipelining`` schedules that run it (1F1B by default, GPipe on
  request) and :meth:`Pipe.step`, which runs the replica's share of a global batch and
  leaves one process's gradient over the whole batch;
- :mod:`.wrap`: ``ctx.wrap(model, pipeline=N)``, the way in of a training loop.

A checkpoint of a pipeline is keyed by the whole model's names and written by every rank
with ``torch.distributed.checkpoint`` (``hetero.trainer.shardstate``), so it loads onto
another split, or another number of replicas.
"""

from hetero.trainer.pipeline.pipe import Pipe, build
from hetero.trainer.pipeline.profile import STATE_BYTES_PER_PARAM, profile, speed_probe
from hetero.trainer.pipeline.stage import Loss, Stage, StageClock, lm_loss, traced_stage

__all__ = [
    "STATE_BYTES_PER_PARAM",
    "Loss",
    "Pipe",
    "Stage",
    "StageClock",
    "build",
    "lm_loss",
    "profile",
    "speed_probe",
    "traced_stage",
]
