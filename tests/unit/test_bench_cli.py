"""``hetero-bench``: the sim subcommand's output, JSON rows and one-line errors."""

from __future__ import annotations

import json
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from hetero.bench.cli import main


def test_hetero_bench_is_installed_as_a_console_script() -> None:
    (ep,) = [e for e in entry_points(group="console_scripts") if e.name == "hetero-bench"]
    assert ep.value == "hetero.entry:bench"


def test_sim_prints_a_table_marked_simulated_and_writes_json_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sim.json"
    code = main(
        [
            "sim",
            "--scenario",
            "two-workers",
            "--policy",
            "equal",
            "--policy",
            "dynamic",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    assert "SIMULATED" in capsys.readouterr().out
    rows = json.loads(out.read_text())
    assert [r["policy"] for r in rows] == ["equal", "dynamic"]
    for row in rows:
        assert row["simulated"] is True
        for key in (
            "scenario",
            "policy",
            "pct_of_ideal",
            "reconverge_intervals",
            "churn_pct",
            "stragglers_flagged",
            "false_positives",
        ):
            assert key in row
    assert rows[0]["speedup_vs_equal"] == 1.0
    assert rows[1]["speedup_vs_equal"] > 1.3


def test_unknown_scenario_is_one_line_on_stderr_and_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["sim", "--scenario", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("error: unknown scenario 'nope' (known: ")
    assert "neighbour" in err and "Traceback" not in err


def test_unknown_policy_is_one_line_on_stderr_and_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["sim", "--scenario", "two-workers", "--policy", "fastest"]) == 2
    assert capsys.readouterr().err.startswith("error: unknown policy 'fastest'")
