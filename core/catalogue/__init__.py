"""The catalogue: every built-in model, dataset, policy and training option, described once.

``hetero-train``'s flags, job.yaml's keys and the keywords of ``ht.train`` /
``ht.init`` are all derived from it, with the same names, defaults and bounds:

- :mod:`.entries`: the models, datasets and policies by name (the trainer
  registers an implementation against each, and a test checks the sets match);
- :mod:`.training`: ``TrainingOptions``, one field per option, a validated
  configuration when constructed;
- :mod:`.rules`: the rules between options;
- :mod:`.commandline`, :mod:`.keywords`, ``hetero.core.jobspec``: the three
  ways in; :mod:`.reference`: the tables of the docs.

Standard library and PyYAML only, like the rest of ``hetero.core``.
"""

from hetero.core.catalogue.entries import (
    DATASET_ALIASES,
    DATASETS,
    MODELS,
    POLICIES,
    DatasetEntry,
    ModelEntry,
    PolicyEntry,
    dataset,
    default_dataset,
    model,
)
from hetero.core.catalogue.options import Entry, Option, OptionError
from hetero.core.catalogue.training import BY_NAME, OPTIONS, TrainingOptions

__all__ = [
    "BY_NAME",
    "DATASETS",
    "DATASET_ALIASES",
    "MODELS",
    "OPTIONS",
    "POLICIES",
    "DatasetEntry",
    "Entry",
    "ModelEntry",
    "Option",
    "OptionError",
    "PolicyEntry",
    "TrainingOptions",
    "dataset",
    "default_dataset",
    "model",
]
