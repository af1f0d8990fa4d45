"""``hetero-bench run SCENARIO`` and ``hetero-bench report DIR``.

``run`` executes a scenario's runs (plain-DDP baseline, hetero's policies,
references) on this machine and writes ``manifest.json``, ``runs/<name>/``,
``results.json``, ``results.csv`` and ``report.md`` under ``--out``;
``--dry-run`` prints the exact commands and starts nothing. ``report`` rebuilds
the results, the report and the PNG plots from a run directory. Nothing on
this path imports rich, textual or sqlalchemy (a GPU machine may lack them),
and torch only once a run really starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from hetero.bench.harness.commands import (
    RunSpec,
    neighbour_argv,
    neighbour_stem,
    prepare_argv,
    run_specs,
)
from hetero.bench.harness.resize import configure
from hetero.bench.harness.scenario import known_scenarios, load_scenario
from hetero.bench.harness.scenariospec import BASELINE, Scenario
from hetero.core.errors import ConfigError


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``run`` and ``report`` on ``hetero-bench``'s subparsers."""
    p = sub.add_parser(
        "run",
        help="run a benchmark scenario on this machine's GPUs/CPUs",
        description="Run plain DDP and hetero's policies on a scenario and report samples/s, "
        "% of ideal, speedups, load imbalance, GPU utilization, adaptation time and plan "
        "changes, and check the scenario's targets (each measured value with pass or MISS).",
    )
    p.add_argument("scenario", nargs="?", metavar="SCENARIO", help="scenario name (see --list)")
    p.add_argument("--out", type=Path, help="run directory (default runs/bench/SCENARIO-DATE)")
    p.add_argument("--steps", type=int, help="training steps per run (change steps scale along)")
    p.add_argument("--ideal-steps", type=int, help="steps per rank of the standalone measurement")
    p.add_argument("--quick", action="store_true", help="the scenario's short version")
    p.add_argument(
        "--policies", help="comma-separated hetero policies to run (default: the scenario's)"
    )
    p.add_argument("--no-baseline", action="store_true", help="skip the plain-DDP baseline")
    p.add_argument("--run-timeout", type=float, metavar="S", help="seconds before a run is stopped")
    p.add_argument("--dry-run", action="store_true", help="print the commands; run nothing")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.set_defaults(func=run_command)

    r = sub.add_parser(
        "report",
        help="rebuild results, report.md and plots from a run directory",
        description="Recompute every figure from a run directory's metrics, check the "
        "scenario's targets again, and rewrite results.json, results.csv, report.md and the "
        "PNG plots (plots need matplotlib).",
    )
    r.add_argument("dir", type=Path, metavar="DIR")
    r.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    r.set_defaults(func=report_command)


def _scenario(args: argparse.Namespace) -> Scenario:
    if not args.scenario:
        raise ConfigError(f"name a scenario (known: {', '.join(known_scenarios())})")
    policies = tuple(p.strip() for p in args.policies.split(",")) if args.policies else None
    return configure(
        load_scenario(args.scenario),
        quick=args.quick,
        steps=args.steps,
        ideal_steps=args.ideal_steps,
        policies=policies,
        baseline=False if args.no_baseline else None,
    )


def run_command(args: argparse.Namespace) -> int:
    if args.list:
        for name in known_scenarios():
            print(f"{name}: {load_scenario(name).description}")
        return 0
    scenario = _scenario(args)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    out: Path = (args.out or Path("runs") / "bench" / f"{scenario.name}-{stamp}").resolve()
    specs = run_specs(scenario, out)
    timeout_s = args.run_timeout or scenario.run_timeout_s
    if args.dry_run:
        print_plan(scenario, specs, out, timeout_s)
        return 0
    from hetero.bench.harness import report, runner
    from hetero.bench.harness.gpu_monitor import GpuMonitor

    runner.preflight(scenario)
    # `timeout`, a batch system or a job scheduler stop the harness with SIGTERM: turn it
    # into the same path as Ctrl-C, so every run and neighbour (each in its own session)
    # is stopped before the harness exits.
    signal.signal(signal.SIGTERM, _interrupt)
    out.mkdir(parents=True, exist_ok=True)
    monitor = GpuMonitor(scenario.gpus)
    manifest = _manifest(
        scenario, specs, monitor, quick=args.quick, argv=getattr(args, "argv", None)
    )
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    runner.progress(f"hetero-bench run {scenario.name}: {len(specs)} runs -> {out}")
    failures = 0
    interrupted = False
    try:
        prepare = prepare_argv(scenario, out)
        if prepare:
            runner.progress(f"prepare: {shlex.join(prepare)}")
            if subprocess.run(prepare, check=False).returncode != 0:
                raise ConfigError(f"the preparation step failed: {shlex.join(prepare)}")
        for k, spec in enumerate(specs, 1):
            runner.progress(f"[{k}/{len(specs)}] {spec.name} ({spec.runner}, {spec.steps} steps)")
            spec = _with_solo_scores(spec, specs)
            o = runner.execute(spec, scenario, monitor, timeout_s=timeout_s)
            failures += not o.ok
            runner.progress(f"      {'ok' if o.ok else f'FAILED: {o.error}'} in {o.wall_s:.0f} s")
    except KeyboardInterrupt:
        interrupted = True
        runner.progress("interrupted: every process stopped; writing what finished")
    finally:
        monitor.close()
    result = report.write_outputs(out, draw_plots=True)
    for r in result["rows"]:
        if r["samples_per_s"] is not None:
            pct = f"{r['pct_of_ideal']:.1f}% of ideal" if r["pct_of_ideal"] else "ideal n/a"
            vs = f"{r['speedup_vs_ddp']:.2f}x DDP" if r["speedup_vs_ddp"] else ""
            print(
                f"{r['run']:>16} {r['window']:>9}  {r['samples_per_s']:>10,.0f} samples/s  {pct}  {vs}"
            )
            if r.get("gap_verdict"):
                print(f"{'':>16} {'':>9}  {r['gap_verdict']}")
    print_targets(result["targets"])
    print(f"wrote {out}/results.json, results.csv, report.md")
    if interrupted:
        return 130
    return 1 if failures else 0


def print_targets(checks: list[dict[str, Any]]) -> None:
    """One line per checked target: the run, its window, the measured value, pass or miss."""
    for c in checks:
        print(f"target {c['target']}: {c['run']} {c['window']} {c['measured']} {c['result']}")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def print_plan(scenario: Scenario, specs: list[RunSpec], out: Path, timeout_s: float) -> None:
    """The dry run: what would run, in order, with every command and environment."""
    emu = " (EMULATED)" if scenario.emulated else ""
    print(f"# scenario {scenario.name}{emu}: {scenario.description}")
    print(f"# {scenario.ranks} ranks, {scenario.gpus} GPU(s), {scenario.steps} steps, out {out}")
    print(f"# each run is stopped after {timeout_s:.0f} s; nothing below was run (--dry-run)")
    for s, label in scenario.change_steps:
        print(f"# change at step {s}: {label}")
    if scenario.loop == "zoo":
        workers = " or ".join(str(n) for n in scenario.num_workers)
        print(
            f"# zoo loop under torchrun, data paths {', '.join(scenario.data_paths)} "
            f"({workers} loader workers per rank); the model comes from timm, or "
            "torchvision when timm is missing (each run says which)"
        )
    if scenario.repeats > 1:
        print(f"# {scenario.repeats} repeats, each plain DDP then the policies (alternating)")
    for line in scenario.emulation():
        print(f"# {line}")
    prepare = prepare_argv(scenario, out)
    if prepare:
        print("# prepare the token file once, before the runs:")
        print(shlex.join(prepare))
    for n in scenario.neighbours:
        when = (
            "for the whole run"
            if n.arrive_step is None
            else f"idle, switched on at the boundary >= step {n.arrive_step}"
            + (f", off at >= step {n.leave_step}" if n.leave_step else "")
        )
        stem = "RUN/" + neighbour_stem(scenario, n)
        argv = neighbour_argv(
            n, Path(f"{stem}.control"), Path(f"{stem}.jsonl"), Path(f"{stem}.ready")
        )
        print(f"# {n.weight} neighbour on GPU {n.gpu} ({when}), RUN = {out}/runs/<name>:")
        print(shlex.join(argv))
    for spec in specs:
        print(
            f"\n# {spec.name} ({spec.runner}, {spec.ranks} rank(s), ideal {spec.ideal_steps} steps)"
        )
        print(spec.shell())


def _software() -> str:
    parts = [f"python {platform.python_version()}"]
    for dist in ("torch", "torchvision", "timm", "nvidia-ml-py"):
        try:
            parts.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            parts.append(f"{dist} n/a")
    return ", ".join(parts)


def _device(scenario: Scenario, names: list[str]) -> str:
    cpu = f"CPU, {os.cpu_count()} cores"
    if scenario.gpus == 0:
        return cpu
    if not names:
        try:
            import torch

            names = [torch.cuda.get_device_name(i) for i in range(scenario.gpus)]
        except Exception:  # no CUDA: say so rather than fail the report
            names = ["GPU (name n/a)"] * scenario.gpus
    gpus = f"{len(names)}x {names[0]}" if len(set(names)) == 1 else " + ".join(names)
    if scenario.devices == "mixed":
        return f"{gpus} + {scenario.ranks - scenario.gpus} CPU ranks ({cpu})"
    return gpus


def _manifest(
    scenario: Scenario, specs: list[RunSpec], monitor: Any, *, quick: bool, argv: list[str] | None
) -> dict[str, Any]:
    return {
        "scenario": asdict(scenario),
        "runs": [s.name for s in specs],
        "specs": [{"name": s.name, "command": s.shell()} for s in specs],
        "changes": [list(c) for c in scenario.change_steps],
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "device": _device(scenario, monitor.names),
        "nvml": bool(monitor.available),
        "software": _software(),
        "command": shlex.join(["hetero-bench", *(sys.argv[1:] if argv is None else argv)]),
        "quick": quick,
        "started_perf_s": time.perf_counter(),
    }


def report_command(args: argparse.Namespace) -> int:
    from hetero.bench.harness import plots, report

    result = report.write_outputs(args.dir, draw_plots=not args.no_plots)
    print_targets(result["targets"])
    print(f"wrote {args.dir}/results.json, results.csv, report.md")
    if result["plots"]:
        print("plots: " + ", ".join(p.name for p in result["plots"]))
    elif not args.no_plots and not plots.matplotlib_available():
        print("no plots: matplotlib is not installed (pip install 'hetero[bench]')")
    return 0


def _with_solo_scores(spec: RunSpec, specs: list[RunSpec]) -> RunSpec:
    """``proportional`` and ``hybrid`` get each GPU's solo throughput as its score.

    The plain-DDP baseline runs first and measures every rank alone at B/W; a
    static split by those rates is the "static split by solo throughput" of
    ``docs/design.md``. Without a baseline summary the policies fall back to equal.
    """
    if spec.policy not in ("proportional", "hybrid"):
        return spec
    base = next(
        (
            s
            for s in specs
            if s.policy == BASELINE
            and (s.data_path, s.num_workers, s.repeat)
            == (spec.data_path, spec.num_workers, spec.repeat)
        ),
        None,
    )
    if base is None or not base.summary_path.is_file():
        return spec
    rates = json.loads(base.summary_path.read_text()).get("standalone_samples_per_s") or []
    if len(rates) != spec.ranks or not all(r > 0 for r in rates):
        return spec
    scores = ",".join(f"{r:.1f}" for r in rates)
    return dataclasses.replace(spec, argv=(*spec.argv, "--compute-scores", scores))
