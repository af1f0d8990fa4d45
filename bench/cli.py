"""``hetero-bench``: the benchmark harness. One subcommand per kind of benchmark.

Each subcommand lives in its own module and registers itself here through an
``add_parser(subparsers)`` function that sets ``func``: ``sim`` (the cluster
simulator), ``run`` and ``report`` (real runs on this machine's GPUs or CPUs,
``hetero.bench.harness``). Registering imports no rich or torch: a GPU machine
without rich still runs ``hetero-bench run``.
Errors a user can fix (``HeteroError``) print as one line on stderr and exit
with the error's code (2 for bad arguments or config), never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from hetero.bench import load, simulate_nodes
from hetero.bench.harness import cli as harness_cli
from hetero.bench.sim import report as sim_report
from hetero.core.errors import HeteroError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hetero-bench", description="Benchmarks for hetero's balancer and trainer."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sim_report.add_parser(sub)
    harness_cli.add_parser(sub)
    simulate_nodes.add_parser(sub)
    load.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    try:
        code: int = args.func(args)
    except HeteroError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return code


if __name__ == "__main__":
    sys.exit(main())
