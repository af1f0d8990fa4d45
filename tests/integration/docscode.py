"""docs/trainer.md's logging example, as the tests execute it: the docs' own lines, so
that a test fails where the docs stop working (``test_interval_logging.py``, and with
the loggers themselves ``test_ecosystem_wandb.py`` and ``test_ecosystem_mlflow.py``)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import TensorDataset

from hetero import trainer as ht

TRAINER_MD = Path(__file__).parents[2] / "docs" / "trainer.md"


def logging_block() -> dict[str, str]:
    """The logging section's code block by part: ``"flat"`` (the function) and one per
    logger, named by the first word of its ``# Logger (...)`` comment (``"Weights"``,
    ``"MLflow"``)."""
    blocks = re.findall(r"```python\n(.*?)```", TRAINER_MD.read_text(), re.S)
    block = next(b for b in blocks if "def flat(" in b)
    first, *loggers = re.split(r"^(?=# )", block, flags=re.M)
    return {"flat": first} | {part[2:].split()[0]: part for part in loggers}


def docs_flat() -> Callable[[dict[str, Any]], dict[str, float]]:
    """``flat`` from docs/trainer.md's logging section, executed as the docs show it."""
    namespace: dict[str, Any] = {}
    exec(logging_block()["flat"], namespace)
    return namespace["flat"]  # type: ignore[no-any-return]


#: The runs of :func:`run_logging_example`: steps, and a boundary every ``INTERVAL``.
STEPS, INTERVAL = 12, 3


def run_logging_example(logger: str, module: Any) -> list[tuple[int, dict[str, float]]]:
    """:data:`STEPS` steps of a regression on one CPU process with the docs' example for
    ``logger`` (the first word of its comment) executed after ``ht.init``, ``module`` in
    scope under its own name; returns what the docs' ``flat`` made of each boundary's
    figures, with the boundary's step (checked: every :data:`INTERVAL` steps)."""
    flat = docs_flat()
    logged: list[tuple[int, dict[str, float]]] = []
    ctx = ht.init("equal", device="cpu", rebalance_interval=INTERVAL)
    try:
        exec(logging_block()[logger], {"ctx": ctx, "flat": flat, module.__name__: module})
        ctx.on_interval(lambda f: logged.append((f["step"], flat(f))))
        model = ctx.wrap(torch.nn.Linear(2, 1))
        loader = ctx.loader(TensorDataset(torch.randn(64, 2), torch.randn(64, 1)), 8)
        while ctx.global_step < STEPS:
            for x, y in loader:
                loss = torch.nn.functional.mse_loss(model(x), y)
                ctx.backward(loss)
                ctx.step(loss)
                if ctx.global_step == STEPS:
                    break
    finally:
        ctx.close()
    assert [step for step, _ in logged] == list(range(INTERVAL, STEPS + 1, INTERVAL))
    assert all(values["hetero/rank0/batch"] == 8 for _, values in logged)
    assert "hetero/gap/imbalance_ms" in logged[-1][1]
    return logged
