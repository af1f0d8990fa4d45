"""Execute a scenario's runs one after another, each with its neighbour and NVML sampling.

Every run is its own process tree, started in a new session so that stopping
it (timeout, error, Ctrl-C) signals the whole group and leaves no rank
behind. A run that fails is recorded and the next one starts: on a GPU host
booked for a limited time one bad run should not cost the others. Each run leaves
``runs/<name>/run.json`` (command, exit status, wall seconds, neighbour
switches), which ``hetero-bench report`` reads back together with the run's
``summary.json`` and ``metrics/``.

The dynamic neighbour: the harness tails rank 0's metrics file (one record
per rebalance interval) and switches the neighbour through its control file
at the first record whose ``step`` reaches ``arrive_step`` / ``leave_step``.
The switch lands within a poll (20 ms) of that boundary, so a change is
resolved to one interval; the steps actually used are written to run.json.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hetero.bench.harness.commands import SAFE_ENV, RunSpec, neighbour_argv, neighbour_stem
from hetero.bench.harness.gpu_monitor import GpuMonitor, write_samples
from hetero.bench.harness.neighbour import NeighbourProcess
from hetero.bench.harness.scenariospec import Neighbour, Scenario
from hetero.core.errors import ConfigError

POLL_S = 0.02


@dataclass
class RunOutcome:
    """What happened to one run (``run.json``). Times in seconds."""

    name: str
    runner: str
    command: str
    policy: str = ""
    data_path: str = "device"
    num_workers: int = 0
    repeat: int = 1
    returncode: int | None = None
    wall_s: float = 0.0
    timed_out: bool = False
    error: str | None = None
    switches: list[dict[str, Any]] = field(default_factory=list)
    started_time_s: float = 0.0

    @property
    def ok(self) -> bool:
        """Every rank exited 0 and nothing went wrong around them."""
        return self.returncode == 0 and self.error is None


class MetricsTail:
    """New complete JSON lines of a file that another process appends to."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def read(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self._offset)
                chunk = fh.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        out = []
        for line in lines:
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return out


def preflight(scenario: Scenario) -> None:
    """Fail fast, before any device time is spent, if the machine cannot run ``scenario``."""
    if importlib.util.find_spec("torch") is None:
        # Every run trains: one line naming the extra (hetero.entry), not a failure per run.
        raise ModuleNotFoundError("No module named 'torch'", name="torch")
    if scenario.gpus == 0:
        return
    import torch

    have = torch.cuda.device_count()
    if have < scenario.gpus:
        raise ConfigError(
            f"scenario {scenario.name} needs {scenario.gpus} GPU(s), this machine has {have} "
            "(--dry-run prints the commands without running them)"
        )


def execute(
    spec: RunSpec, scenario: Scenario, monitor: GpuMonitor, *, timeout_s: float
) -> RunOutcome:
    """Run ``spec`` to completion (or ``timeout_s``), with the scenario's neighbours around it."""
    out = spec.out_dir
    out.mkdir(parents=True, exist_ok=True)
    for old in (out / "metrics").glob("rank*.jsonl"):
        old.unlink()  # a re-run must not read the previous run's records
    outcome = RunOutcome(
        spec.name,
        spec.runner,
        spec.shell(),
        policy=spec.policy or spec.name,
        data_path=spec.data_path,
        num_workers=spec.num_workers,
        repeat=spec.repeat,
        started_time_s=time.time(),
    )
    neighbours: list[tuple[Neighbour, NeighbourProcess]] = []
    proc: subprocess.Popen[bytes] | None = None
    t0 = time.perf_counter()
    try:
        for nb in scenario.neighbours:
            stem = out / neighbour_stem(scenario, nb)
            control, ready = stem.with_suffix(".control"), stem.with_suffix(".ready")
            process = NeighbourProcess(
                neighbour_argv(nb, control, stem.with_suffix(".jsonl"), ready),
                control,
                ready,
                env=SAFE_ENV,
                start_on=nb.arrive_step is None,
                stderr_path=stem.with_suffix(".stderr.log"),
            )
            neighbours.append((nb, process))
            process.start()
            outcome.switches.append(
                {"step": 0, "on": process.on, "gpu": nb.gpu, "time_s": time.time()}
            )
        monitor.start()
        with (out / "stdout.log").open("wb") as so, (out / "stderr.log").open("wb") as se:
            proc = subprocess.Popen(
                list(spec.argv),
                env=dict(os.environ) | dict(spec.env),
                stdout=so,
                stderr=se,
                start_new_session=True,
            )
            tail = MetricsTail(spec.metrics_dir / "rank0.jsonl")
            deadline = time.monotonic() + timeout_s
            while proc.poll() is None:
                records = tail.read()
                for nb, process in neighbours:
                    if nb.arrive_step is not None:
                        _follow(records, nb, process, outcome)
                if any(not process.alive() for _, process in neighbours):
                    outcome.error = "a neighbour process died during the run"
                    break
                if time.monotonic() > deadline:
                    outcome.timed_out = True
                    outcome.error = f"still running after {timeout_s:.0f} s; stopped"
                    break
                time.sleep(POLL_S)
    except RuntimeError as exc:  # the neighbour failed to start
        outcome.error = str(exc)
    finally:
        if proc is not None:
            _stop_group(proc)
            outcome.returncode = proc.returncode
        for _, process in neighbours:
            process.stop()
        write_samples(out / "gpu_util.jsonl", monitor.stop())
        outcome.wall_s = time.perf_counter() - t0
        (out / "run.json").write_text(json.dumps(asdict(outcome), indent=2) + "\n")
    if outcome.returncode not in (0, None) and outcome.error is None:
        outcome.error = f"exited with status {outcome.returncode}: {_last_line(out / 'stderr.log')}"
        (out / "run.json").write_text(json.dumps(asdict(outcome), indent=2) + "\n")
    return outcome


def _follow(
    records: list[dict[str, Any]], nb: Neighbour, neighbour: NeighbourProcess, outcome: RunOutcome
) -> None:
    assert nb.arrive_step is not None
    for rec in records:
        step = int(rec.get("step", 0))
        want = step >= nb.arrive_step and (nb.leave_step is None or step < nb.leave_step)
        if want != neighbour.on:
            neighbour.switch(want)
            outcome.switches.append(
                {"step": step, "on": want, "gpu": nb.gpu, "time_s": time.time()}
            )


def _stop_group(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """SIGTERM (then SIGKILL) the run's whole process group, even if its leader has exited."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            continue
        # The leader is gone; give stragglers in its group a moment, then make sure.
        time.sleep(0.2)
    proc.wait()


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except FileNotFoundError:
        return "no stderr"
    return lines[-1][:300] if lines else "no output on stderr"


def progress(text: str) -> None:
    """One progress line on stderr (stdout stays clean for --json style use)."""
    print(text, file=sys.stderr, flush=True)
