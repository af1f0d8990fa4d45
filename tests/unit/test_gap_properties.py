"""What every gap breakdown must be, whatever the run (hypothesis, and every recorded run).

- every term is ≥ 0, and no negative number reaches the text;
- the terms sum to the gap, max(step − reference, 0), within ``TOLERANCE`` of it
  (|Σ − gap| ≤ 0.02 · gap + 1 ns per step), and the breakdown says it adds up;
- one step time: the window's wall time over its steps, from which the achieved rate,
  % of ideal and every share are computed;
- the verdict names the largest term;
- where no rank is faster in the job than alone and every phase fits its interval,
  the terms add up without any scaling (``scale`` is 1): nothing is absorbed.

The recorded runs are the folders under ``docs/benchmarks/`` and the archives under
``results/`` (``recorded_runs``): at least one must be found.
"""

from __future__ import annotations

import functools
import json
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hetero.core.gap import (
    LABELS,
    TERMS,
    TOLERANCE,
    Breakdown,
    IntervalTimes,
    RankTimes,
    Solo,
    intervals_from_records,
    solos_from_summary,
)
from hetero.core.verdict import diagnose, lines

ROOT = Path(__file__).resolve().parents[2]


def _jsonl(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut off by a killed run
    return out


def recorded_runs(root: Path = ROOT) -> Iterator[tuple[str, list[list[dict[str, Any]]], Any]]:
    """Every recorded run as (name, per-rank metrics records, summary or None): a run is a
    folder holding ``metrics/rank<R>.jsonl``, in the folders under ``docs/benchmarks/``
    and inside the ``results/**/*.tar.gz`` archives, read in place (nothing extracted)."""

    def runs(files: dict[PurePosixPath, Any], where: str) -> Iterator[Any]:
        for path in sorted(files):
            if path.name == "rank0.jsonl" and path.parent.name == "metrics":
                run = path.parent.parent
                ranks = sorted(
                    (
                        p
                        for p in files
                        if p.parent == path.parent and re.fullmatch(r"rank\d+\.jsonl", p.name)
                    ),
                    key=lambda p: int(p.stem.removeprefix("rank")),
                )
                summary = files.get(run / "summary.json")
                yield (
                    f"{where}:{run}",
                    [_jsonl(files[p]()) for p in ranks],
                    json.loads(summary()) if summary else None,
                )

    docs = root / "docs" / "benchmarks"
    if docs.is_dir():
        found = {
            PurePosixPath(p.relative_to(docs).as_posix()): p.read_text
            for p in docs.rglob("*")
            if p.suffix in (".jsonl", ".json") and p.is_file()
        }
        yield from runs(found, "docs/benchmarks")
    for archive in sorted((root / "results").rglob("*.tar.gz")):
        with tarfile.open(archive) as tar:
            members = {
                PurePosixPath(m.name): functools.partial(_member, tar, m)
                for m in tar.getmembers()
                if m.isfile() and m.name.endswith((".jsonl", ".json"))
            }
            yield from runs(members, str(archive.relative_to(root)))


def _member(tar: tarfile.TarFile, m: tarfile.TarInfo) -> str:
    f = tar.extractfile(m)
    return f.read().decode() if f is not None else ""


def check(bd: Breakdown, intervals: list[IntervalTimes], solos: Any, *, exact: bool) -> None:
    """The properties of the module doc, on one breakdown."""
    terms = [bd.term(t) for t in TERMS]
    values = [t.ms_per_step for t in terms if t.ms_per_step is not None]
    assert all(v >= 0 for v in values), {t.name: t.ms_per_step for t in terms}
    gap = max(bd.gap_ms, 0.0)
    assert bd.adds_up
    assert abs(sum(values) - gap) <= TOLERANCE * gap + 1e-6, (sum(values), gap)
    # One step time: the window's wall over its steps; everything else follows from it.
    window = [iv for iv in intervals if bd.first_step < iv.end_step <= bd.last_step]
    plan = tuple(s.batch for s in solos) if solos else window[-1].plan
    if any(iv.plan == plan for iv in window):  # the intervals at the solo batches
        window = [iv for iv in window if iv.plan == plan]
    assert sum(iv.steps for iv in window) == bd.steps
    assert bd.step_ms == _approx(1e3 * sum(iv.wall_s for iv in window) / bd.steps)
    assert bd.gap_ms == _approx(bd.step_ms - bd.reference_ms)
    B = sum(window[-1].plan)
    assert bd.achieved_samples_per_s == _approx(B / bd.step_ms * 1e3)
    for t in terms:
        if t.ms_per_step is not None:
            assert t.pct == _approx(100 * t.ms_per_step / bd.step_ms)
    if bd.ideal_samples_per_s:
        assert bd.pct_of_ideal == _approx(100 * bd.achieved_samples_per_s / bd.ideal_samples_per_s)
        assert bd.reference_ms == _approx(1e3 * B / bd.ideal_samples_per_s)
    # The verdict names the largest term.
    if gap > 1e-6 and max(values) > 0:  # a gap of 1 ns per step or more
        largest = max(terms, key=lambda t: t.ms_per_step or 0.0)
        assert bd.largest == largest.name and LABELS[largest.name] in bd.verdict
    else:
        assert bd.largest is None and "nothing to break down" in bd.verdict
    if exact:
        assert bd.scale == 1.0
    text = lines(bd.to_dict())
    head = next(i for i, line in enumerate(text) if "ms/step" in line and "where" in line)
    rows = text[head + 1 : head + 1 + len(TERMS)]
    assert all(r.strip().startswith(LABELS[t]) for r, t in zip(rows, TERMS, strict=True))
    assert len(rows) == len(TERMS) and not any(re.search(r"(?<![\w.])-\d", r) for r in rows)
    w = bd.whole_run
    assert w is not None and 0 <= w.plan_change_s <= w.wall_s + 1e-9 and w.slow_s >= 0


def _approx(x: float) -> Any:
    import pytest

    return pytest.approx(x, rel=1e-9, abs=1e-9)


# -- generated intervals ------------------------------------------------------------------


@st.composite
def jobs(draw: st.DrawFn) -> tuple[list[IntervalTimes], list[Solo] | None, bool]:
    """A run: its intervals, its solo measurement (or none), and whether it is physical
    (every phase in the job at least its solo value, every interval's wall time at
    least its steps' time): then nothing may be absorbed."""
    world = draw(st.integers(1, 4))
    ddp = draw(st.booleans())
    physical = draw(st.booleans())
    B = 64 * world
    plans = draw(st.lists(_plans(world, B), min_size=1, max_size=3, unique=True))
    n = draw(st.integers(1, 12))
    which = draw(st.lists(st.integers(0, len(plans) - 1), min_size=n, max_size=n))
    # Per rank: seconds per sample alone, compute and optimizer, for the ideal and the job.
    per_sample = draw(st.lists(st.floats(1e-4, 4e-3), min_size=world, max_size=world))
    opt = draw(st.lists(st.floats(1e-4, 2e-2), min_size=world, max_size=world))
    final = plans[which[-1]]
    solos = None
    if draw(st.booleans()):
        phases = draw(st.booleans())
        solos = [
            Solo(b, b / (b * p + o), None, b * p if phases else None, o if phases else None)
            for b, p, o in zip(final, per_sample, opt, strict=True)
        ]
    unit = st.floats(0.0, 1.0)
    ivs = []
    step = 0
    for k in range(n):
        plan = plans[which[k]]
        steps = draw(st.integers(1, 40))
        lo = 1.0 if physical else 0.7
        ranks = []
        for i, b in enumerate(plan):
            compute = b * per_sample[i] * draw(st.floats(lo, 1.6))
            optimizer = opt[i] * draw(st.floats(lo, 1.4))
            data = draw(unit) * draw(st.sampled_from([1e-4, 1e-2, 0.2]))
            ranks.append([data, compute, optimizer])
        # Lock step: every rank's mean step is the slowest's busy time plus the all-reduce.
        allreduce = draw(unit) * 0.02
        period = max(sum(r) for r in ranks) + allreduce
        times = tuple(
            RankTimes(b, d, None, o, period)
            if ddp
            else RankTimes.of_phases(b, d, c / 2, c / 2, period - d - c - o, o)
            for b, (d, c, o) in zip(plan, ranks, strict=True)
        )
        if not physical and draw(st.booleans()):  # settled steps slower than the interval
            period *= draw(st.floats(0.8, 1.0))
        outside = draw(unit) * draw(st.sampled_from([1e-4, 1e-2, 2.0]))
        step += steps
        measured = k == n - 1 or draw(st.integers(0, 9)) > 0  # one unmeasured in ten
        ivs.append(
            IntervalTimes(
                step,
                steps,
                steps * (period + outside),
                times if measured else tuple(RankTimes(b) for b in plan),
                measured,
            )
        )
    return ivs, solos, physical


def _plans(world: int, B: int) -> st.SearchStrategy[tuple[int, ...]]:
    return st.lists(st.integers(1, 6), min_size=world, max_size=world).map(lambda ws: _cut(ws, B))


def _cut(weights: list[int], B: int) -> tuple[int, ...]:
    sizes = [max(B * w // sum(weights), 1) for w in weights]
    sizes[0] += B - sum(sizes)
    return tuple(sizes)


@settings(max_examples=300, deadline=None)
@given(jobs())
def test_every_breakdown_of_a_generated_run_adds_up_with_terms_at_least_zero(
    job: tuple[list[IntervalTimes], list[Solo] | None, bool],
) -> None:
    intervals, solos, physical = job
    bd = diagnose(intervals, solos)
    if bd is None:  # no measured interval in the window (at the solo batches)
        final = intervals[-1].plan
        latter = intervals[len(intervals) // 2 :]
        assert not any(iv.measured and iv.plan == final for iv in latter)
        return
    # Without a solo measurement the reference is the ranks' own work in the window's
    # measured intervals, which another interval at that plan may beat: then that is
    # absorbed, even in a physical run.
    check(bd, intervals, solos, exact=physical and solos is not None)


def test_every_recorded_run_has_a_breakdown_that_adds_up() -> None:
    found = 0
    for name, ranks, summary in recorded_runs():
        intervals = intervals_from_records(ranks)
        solos = solos_from_summary(summary)
        bd = diagnose(intervals, solos)
        if bd is None:
            continue
        found += 1
        try:
            check(bd, intervals, solos if bd.ideal_samples_per_s else None, exact=False)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from exc
    assert found >= 1, "no recorded run under docs/benchmarks/ or results/"


def test_recorded_runs_are_found_in_folders_and_in_archives(tmp_path: Path) -> None:
    run = tmp_path / "2026-12-01-demo" / "runs" / "dynamic"
    (run / "metrics").mkdir(parents=True)
    rec = {"step": 10, "rank": 0, "interval_wall_s": 1.0, "batch": 8, "steps_measured": 9}
    (run / "metrics" / "rank0.jsonl").write_text(json.dumps(rec) + "\n")
    (run / "summary.json").write_text(json.dumps({"final_plan": [8]}))
    (tmp_path / "results" / "benchmarks").mkdir(parents=True)
    with tarfile.open(
        tmp_path / "results" / "benchmarks" / "2026-12-01-demo.tar.gz", "w:gz"
    ) as tar:
        tar.add(tmp_path / "2026-12-01-demo", arcname="2026-12-01-demo")
    (tmp_path / "docs" / "benchmarks" / "x" / "metrics").mkdir(parents=True)
    (tmp_path / "docs" / "benchmarks" / "x" / "metrics" / "rank0.jsonl").write_text(json.dumps(rec))
    got = {name: (ranks, summary) for name, ranks, summary in recorded_runs(tmp_path)}
    assert got == {
        "docs/benchmarks:x": ([[rec]], None),
        "results/benchmarks/2026-12-01-demo.tar.gz:2026-12-01-demo/runs/dynamic": (
            [[rec]],
            {"final_plan": [8]},
        ),
    }
