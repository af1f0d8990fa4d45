"""``hetero-bench sim``: run scenarios × policies and show the results.

The table goes to stdout (rich, imported only when this subcommand runs), ``--json`` writes one object per row. Every
row and the table title say the numbers are simulated.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from hetero.bench.sim.engine import simulate
from hetero.bench.sim.metrics import SimResult, summarize
from hetero.bench.sim.scenario import Scenario, known_scenarios, load_scenario
from hetero.core.balancer import Policy, make_policy

if TYPE_CHECKING:
    from rich.table import Table

DEFAULT_POLICIES = ("equal", "proportional", "dynamic", "hybrid")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the ``sim`` subcommand on ``hetero-bench``'s subparsers."""
    p = sub.add_parser(
        "sim",
        help="run balancer policies on a simulated cluster (no GPU needed)",
        description="Run balancer policies on simulated clusters and report how close "
        "each gets to the ideal throughput. All numbers are simulated.",
    )
    p.add_argument(
        "--scenario",
        action="append",
        metavar="NAME",
        help="scenario to run (repeatable; default: all). See --list.",
    )
    p.add_argument(
        "--policy",
        action="append",
        metavar="P",
        help=f"policy to run (repeatable; default: {' '.join(DEFAULT_POLICIES)})",
    )
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the rows as JSON")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    from rich.console import Console  # lazily: hetero-bench run must work without rich

    # A table this wide folds badly at a pipe's default 80 columns.
    console = Console(width=max(Console().width, 132))
    if args.list:
        for name in known_scenarios():
            console.print(f"{name}: {load_scenario(name).description}", highlight=False)
        return 0
    # Resolve every name before simulating anything: a typo fails at once.
    scenarios = [load_scenario(n) for n in (args.scenario or known_scenarios())]
    policies = [make_policy(p) for p in (args.policy or DEFAULT_POLICIES)]
    results = run_matrix(scenarios, policies)
    console.print(render_table(results))
    if args.json is not None:
        args.json.write_text(json.dumps([r.row() for r in results], indent=2) + "\n")
        console.print(f"wrote {len(results)} rows to {args.json}", highlight=False)
    return 0


def run_matrix(scenarios: Sequence[Scenario], policies: Sequence[Policy]) -> list[SimResult]:
    """Every policy on every scenario, with throughput relative to ``equal`` where it ran."""
    results: list[SimResult] = []
    for scenario in scenarios:
        rows = [summarize(simulate(scenario, policy)) for policy in policies]
        baseline = next((r.samples_per_s for r in rows if r.policy == "equal"), None)
        for r in rows:
            speedup = r.samples_per_s / baseline if baseline else None
            results.append(replace(r, speedup_vs_equal=speedup))
    return results


def render_table(results: Sequence[SimResult]) -> Table:
    from rich.table import Table

    table = Table(
        title="hetero-bench sim: SIMULATED clusters (not measured on hardware)",
        caption="% ideal, % best: steady state, noise-free plan quality; x equal: noisy "
        "simulated throughput over the whole run vs equal; reconverge: worst intervals "
        "below 95% after a sudden change; adapt: worst intervals after a change until "
        "throughput, warm-ups included, holds within 5% of the new steady value; churn: "
        "share of B moved per interval; changes: plans adopted in steady state.",
    )
    for col in ("scenario", "policy"):
        table.add_column(col, no_wrap=True)
    for col in (
        "% ideal",
        "% best",
        "x equal",
        "reconverge",
        "adapt",
        "churn %B",
        "changes",
        "stragglers",
        "false +",
    ):
        table.add_column(col, justify="right")
    last = None
    for r in results:
        if last is not None and r.scenario != last:
            table.add_section()
        last = r.scenario
        if r.reconverge_intervals is None:
            reconverge = "-"
        else:
            reconverge = f"{r.reconverge_intervals}" if r.reconverged else "never"
        table.add_row(
            r.scenario,
            r.policy,
            f"{r.pct_of_ideal:.1f}",
            f"{r.pct_of_best:.1f}",
            "-" if r.speedup_vs_equal is None else f"{r.speedup_vs_equal:.2f}",
            reconverge,
            "-" if r.adapt_intervals is None else str(r.adapt_intervals),
            f"{r.churn_pct:.2f}",
            str(r.plan_changes),
            str(r.stragglers_flagged),
            str(r.false_positives),
        )
    return table
