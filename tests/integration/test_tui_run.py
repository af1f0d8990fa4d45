"""``hetero-top --run``: the live view of a standalone run, driven with Textual's Pilot over
the files a real ``hetero-train`` run wrote (2 CPU ranks on Gloo, rank 1 with an
EMULATED 3x slowdown, evaluations every 10 steps, TensorBoard on).

The snapshot (pytest-textual-snapshot) needs the same pixels on every machine, so
it draws a copy of that run whose measured numbers are replaced by fixed ones:
every field it replaces must exist in the real records (a renamed field fails
here), and everything else stays as hetero-train wrote it. After an intended
change of the view: ``pytest tests/integration/test_tui_run.py --snapshot-update``,
then look at the SVGs under ``__snapshots__/test_tui_run/`` before committing them.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from hetero.core.gap import Solo, intervals_from_records
from hetero.core.verdict import diagnose
from hetero.tui.runapp import RunHelp, RunScreen, RunTop, RunUpdated
from hetero.tui.runfiles import RunFollower
from hetero.tui.runview import run_view
from hetero.tui.widgets import Panel

STEPS, INTERVAL, EVAL_EVERY = 40, 5, 10
FIXED_NOW = 1_767_225_600.0  # 2026-01-01 00:00 UTC

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run") / "demo"
    cmd = [
        sys.executable,
        "-m",
        "hetero.trainer.cli",
        "--nproc",
        "2",
        "--device",
        "cpu",
        "--model",
        "debug",
        "--policy",
        "dynamic",
        "--emulate-slowdown",
        "1:3",
        "--steps",
        str(STEPS),
        "--rebalance-interval",
        str(INTERVAL),
        "--global-batch",
        "32",
        "--eval-every",
        str(EVAL_EVERY),
        "--eval-samples",
        "64",
        "--ideal-steps",
        "2",
        "--output-dir",
        str(out),
        "--summary-json",
        str(out / "summary.json"),
        "--tensorboard",
        str(out / "tb"),
        "--quiet",
        "--json",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def _records(run: Path, rank: int) -> list[dict[str, Any]]:
    lines = (run / "metrics" / f"rank{rank}.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines]


async def until(pilot: Pilot[None], cond: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Let the app run until ``cond()`` holds; fail after ``timeout_s`` (a bound for a
    loaded two-core host, where the pilot shares the cores with another test file)."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await pilot.pause(0.05)


def _panel(app: RunTop, panel_id: str) -> str:
    return str(app.screen_.query_one(f"#{panel_id}", Panel).render())


def test_the_run_view_shows_what_the_run_wrote(run_dir: Path) -> None:
    last = [_records(run_dir, r)[-1] for r in (0, 1)]
    summary = json.loads((run_dir / "summary.json").read_text())

    async def drive() -> None:
        app = RunTop(run_dir, period_s=0.2)
        async with app.run_test(size=(200, 60)) as pilot:
            screen = app.screen_
            await until(pilot, lambda: screen.view is not None and screen.view.gap is not None)
            title = str(screen.query_one("#run-title").render())
            head = str(screen.query_one("#run-summary").render())
            assert "finished" in title and "2 ranks" in title and "dynamic" in title
            assert f"step {STEPS}/{STEPS}" in head
            assert "EMULATED slowdown 1:3x" in head, "emulation must be said"
            batches = _panel(app, "p-batches").splitlines()
            for rank in (0, 1):
                assert batches[rank].split()[-1] == str(last[rank]["batch"])
            assert "emu×3" in _panel(app, "p-per-sample")
            assert "backward" in _panel(app, "p-breakdown")
            assert f"now {last[0]['loss']:.4g}" in _panel(app, "p-loss")
            evals = _panel(app, "p-eval")
            assert "accuracy" in evals and f"step {EVAL_EVERY} … {STEPS}" in evals
            gap = _panel(app, "p-gap")
            assert "finished run's summary" in gap
            assert summary["gap"]["verdict"].split(":")[0] in gap
            await pilot.press("question_mark")
            await until(pilot, lambda: isinstance(app.screen, RunHelp))
            await pilot.press("escape")
            await until(pilot, lambda: isinstance(app.screen, RunScreen))

    asyncio.run(drive())


def test_the_view_follows_records_as_they_are_written(run_dir: Path, tmp_path: Path) -> None:
    """Half the records, then a record cut mid-line, then the rest: the view shows whole
    records only and moves on as they arrive, with no coordinator."""
    live = tmp_path / "live"
    (live / "metrics").mkdir(parents=True)
    lines = {
        r: (run_dir / "metrics" / f"rank{r}.jsonl").read_bytes().splitlines(True) for r in (0, 1)
    }
    half = len(lines[0]) // 2
    for r in (0, 1):
        cut = lines[r][half][:40]  # a record being written
        (live / "metrics" / f"rank{r}.jsonl").write_bytes(b"".join(lines[r][:half]) + cut)

    async def drive() -> None:
        app = RunTop(live, period_s=0.1)
        async with app.run_test(size=(120, 40)) as pilot:
            screen = app.screen_
            await until(pilot, lambda: screen.view is not None and screen.view.job.last_step > 0)
            assert screen.view is not None
            assert screen.view.job.last_step == half * INTERVAL
            assert screen.view.status == "running" and not screen.view.gap_final
            assert "no solo measurement yet" in _panel(app, "p-gap")
            for r in (0, 1):
                with (live / "metrics" / f"rank{r}.jsonl").open("ab") as fh:
                    fh.write(lines[r][half][40:] + b"".join(lines[r][half + 1 :]))
            await until(
                pilot, lambda: screen.view is not None and screen.view.job.last_step == STEPS
            )
            assert screen.view.files.bad_lines == 0

    asyncio.run(drive())


def test_evaluations_reach_tensorboard(run_dir: Path) -> None:
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = accumulator.EventAccumulator(str(run_dir / "tb" / "job"))
    acc.Reload()
    steps = [e.step for e in acc.Scalars("eval/accuracy")]
    assert steps == list(range(EVAL_EVERY, STEPS + 1, EVAL_EVERY)), steps
    evals = [json.loads(x) for x in (run_dir / "metrics" / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [*range(EVAL_EVERY, STEPS + 1, EVAL_EVERY), STEPS]


# ---- the snapshot ------------------------------------------------------------------------


def _pin(record: dict[str, Any], values: dict[str, Any]) -> None:
    for key, value in values.items():
        assert key in record, f"hetero-train no longer writes {key!r}"
        record[key] = value


def _pinned_copy(src: Path, dst: Path) -> None:
    """``src``'s files with every measured number (and the plan, which follows the timing)
    replaced by a fixed function of rank and interval; a plan change at the third."""
    (dst / "metrics").mkdir(parents=True)
    ranks = [_records(src, r) for r in (0, 1)]
    for r, recs in enumerate(ranks):
        for k, rec in enumerate(recs):
            plan = [16, 16] if k < 2 else [22, 10]
            slow = 3.0 if r == 1 else 1.0
            compute = 0.004 * plan[r] / 16 * slow
            _pin(
                rec,
                {
                    "time_s": FIXED_NOW - 60 + k,
                    "interval_wall_s": 0.05 * INTERVAL,
                    "samples_per_s": 500.0 + 40 * k + (300 if k >= 3 else 0),
                    "loss": 2.3 - 0.08 * k,
                    "local_loss": 2.3 - 0.08 * k,
                    "batch": plan[r],
                    "compute_s": compute,
                    "per_sample_compute_s": compute / plan[r],
                    "phases_s": {
                        "data": 0.002,
                        "forward": compute / 3,
                        "backward": 2 * compute / 3,
                        "comm": 0.012 - compute if k >= 3 else 0.01,
                        "optimizer": 0.001,
                    },
                    "step_s": 0.03,
                    "busy_s": compute + 0.003,
                    "peak_memory_bytes": 300_000_000,
                    "plan": plan,
                    "plan_changed": k == 1,
                    "next_plan": [22, 10] if k == 1 else None,
                    "apply_at_step": rec["step"] + 1 if k == 1 else None,
                    "reason": ("dynamic: +31% predicted" if k == 1 else "within dead-band")
                    if r == 0
                    else None,
                    "slowdown": slow,
                },
            )
        lines = "".join(json.dumps(x) + "\n" for x in recs)
        (dst / "metrics" / f"rank{r}.jsonl").write_text(lines)
    evals = [json.loads(x) for x in (src / "metrics" / "eval.jsonl").read_text().splitlines()]
    for k, e in enumerate(evals):
        e.update(time_s=FIXED_NOW - 50 + k, eval_s=0.1)
        _pin(e["metrics"], {"accuracy": 0.2 + 0.1 * k, "loss": 2.2 - 0.1 * k})
    (dst / "metrics" / "eval.jsonl").write_text("".join(json.dumps(x) + "\n" for x in evals))
    info = json.loads((src / "metrics" / "run.json").read_text())
    _pin(
        info,
        {
            "host": "node-a",
            "pid": 1,
            "started_unix_s": FIXED_NOW - 70,
            "ended_unix_s": FIXED_NOW - 5,
        },
    )
    (dst / "metrics" / "run.json").write_text(json.dumps(info))
    summary = json.loads((src / "summary.json").read_text())
    solos = [Solo(22, 11000.0, 0.0, 0.0012, 0.0004), Solo(10, 2500.0, 0.0, 0.0036, 0.0004)]
    steady = 780.0
    bd = diagnose(intervals_from_records(ranks), solos, steady_samples_per_s=steady)
    assert bd is not None
    _pin(
        summary,
        {
            "gap": bd.to_dict(),
            "ideal_samples_per_s": 13500.0,
            "steady_samples_per_s": steady,
            "name": None,
        },
    )
    (dst / "summary.json").write_text(json.dumps(summary))
    for p in dst.rglob("*"):
        os.utime(p, (FIXED_NOW - 5, FIXED_NOW - 5))


@pytest.mark.parametrize("size", [(80, 24), (200, 50)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_run_view_matches_its_snapshot(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, snap_compare: Any, size: Any
) -> None:
    _pinned_copy(run_dir, tmp_path / "runs" / "demo")
    monkeypatch.chdir(tmp_path)  # the title shows the path as given: runs/demo
    app = RunTop(Path("runs/demo"), follow=False)

    async def show(pilot: Pilot[None]) -> None:
        app.animation_level = "none"
        app.post_message(RunUpdated(run_view(RunFollower(Path("runs/demo")).poll(), FIXED_NOW)))
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=show)


def test_hetero_train_top_trains_under_the_view_and_prints_the_summary(tmp_path: Path) -> None:
    """``hetero-train --top`` in a real terminal (a pseudo-terminal): the view comes up,
    the run finishes under it, ``q`` closes it and the summary prints."""
    import pty
    import select

    out = tmp_path / "top"
    cmd = [
        sys.executable,
        "-m",
        "hetero.trainer.cli",
        "--top",
        "--nproc",
        "2",
        "--device",
        "cpu",
        "--model",
        "debug",
        "--emulate-slowdown",
        "1:2",
        "--steps",
        "20",
        "--rebalance-interval",
        "5",
        "--global-batch",
        "16",
        "--ideal-steps",
        "0",
        "--eval-samples",
        "0",
        "--output-dir",
        str(out),
    ]
    pid, fd = pty.fork()
    if pid == 0:  # the child: the command on the pseudo-terminal
        os.environ.update(COLUMNS="120", LINES="40", TERM="xterm-256color")
        os.execv(sys.executable, cmd)
    screen = b""
    deadline = time.monotonic() + 240
    quit_sent = False
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:
                    break  # the child closed the terminal: it exited
                if not chunk:
                    break
                screen += chunk
            if not quit_sent and (out / "summary.json").is_file() and b"finished" in screen:
                time.sleep(1.5)  # the view shows the final figures
                os.write(fd, b"q")
                quit_sent = True
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(fd)
    text = screen.decode("utf-8", "replace")
    assert quit_sent, f"the run did not finish under the view: {text[-1500:]!r}"
    assert os.waitstatus_to_exitcode(status) == 0, text[-1500:]
    assert "hetero-top" in text and "EMULATED" in text
    assert "hetero-train: finished" in text and "throughput (steady)" in text
    assert (out / "train.log").is_file() and (out / "metrics" / "rank1.jsonl").is_file()
