"""hetero's interval figures in MLflow, through docs/trainer.md's own lines (``flat`` and
the MLflow ``ctx.on_interval`` example, executed as written), into a SQLite store under
the test's directory, read back with ``MlflowClient``.

Marked ``ecosystem``: ``make test-ecosystem`` installs mlflow-skinny (pyproject's
``ecosystem`` extra) and runs it; without it the module skips in one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from docscode import run_logging_example

mlflow: Any = pytest.importorskip(
    "mlflow", reason="mlflow is not installed (make test-ecosystem installs mlflow-skinny)"
)

pytestmark = pytest.mark.ecosystem


# MLflow's own SQLAlchemy store, on the SQLAlchemy hetero installs.
@pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy is deprecated")
def test_mlflow_with_a_local_store_gets_each_boundarys_figures_at_its_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    try:
        logged = run_logging_example("MLflow", mlflow)
        run_id = mlflow.active_run().info.run_id
    finally:
        mlflow.end_run()
    client = mlflow.tracking.MlflowClient()
    for key in set().union(*(values for _, values in logged)):
        history = sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)
        expected = [(step, values[key]) for step, values in logged if key in values]
        assert [(m.step, m.value) for m in history] == expected, key
