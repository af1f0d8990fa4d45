"""The numbers and names the training options are declared with: bounds, defaults, choices.

Kept apart from ``TrainingOptions`` so that the job spec, the docs and the
trainer can name a bound without the whole description.
"""

# Upper bounds: a value past these is a typo (or an attack), and some travel as int32
# in hetero.v1 messages, where a larger value could not be sent at all.
MAX_GLOBAL_BATCH = 2**24
MAX_STEPS = 10**8
MAX_EPOCHS = 10**6
MAX_INTERVAL_STEPS = 10**8
MAX_SEED = 2**63 - 1
MAX_RANKS = 4096

DEFAULT_GLOBAL_BATCH = 96
DEFAULT_STEPS = 100
#: Samples scored after training when ``eval_samples`` is not given (fewer for a run
#: that trains on fewer: ``Resolved.eval_samples_for``).
DEFAULT_EVAL_SAMPLES = 512
#: Steps between checkpoints when a checkpoint directory is given without an interval.
DEFAULT_CHECKPOINT_INTERVAL = 500
SGD_LR = 0.05
ADAMW_LR = 6e-4

OPTIMIZERS = ("auto", "sgd", "adamw")
AMP_MODES = ("none", "bf16", "fp16")
DEVICES = ("auto", "cpu", "cuda")
BACKENDS = ("gloo", "nccl")
#: When gradient all-reduces start (hetero.trainer.commsched).
COMM_MODES = ("auto", "overlap", "deferred")
#: Sharded data parallelism through FSDP2 (hetero.trainer.sharding): none is replicated DDP.
SHARD_MODES = ("none", "grad_op", "full")
#: What FSDP2 keeps in host memory: none, or its sharded parameters, gradients and
#: optimizer state (params). ``optimizer`` alone is declared but refused: FSDP2 has no
#: optimizer-only offload (hetero.core.catalogue.rules).
OFFLOAD_MODES = ("none", "optimizer", "params")
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
