"""Whether leaving a rank out pays for the restart it takes (``coordinator.exclusion.paying``).

A forecast of 1,000 -> 2,000 samples/s at a global batch of 16 saves 8 ms a step
(16 ms -> 8 ms); a restart costs the job's start-up plus up to ``interval_steps``
steps run again at the new speed.
"""

from __future__ import annotations

import pytest

from hetero.coordinator.exclusion import UNMEASURED_START_UP_S, Decision, Excluded, paying
from hetero.coordinator.models import JobRow
from hetero.core.balancer import ExclusionForecast
from hetero.core.jobspec import JobSpec, parse_jobspec

SPEC = """\
name: long
model: debug
global_batch: 16
steps: {steps}
checkpoint: {{dir: /tmp/ckpt, interval_steps: 4}}
resources: {{ranks: 2, device: cpu}}
"""


def _decision() -> Decision:
    forecast = ExclusionForecast(1, 1000.0, 2000.0, 1.0, True, (16,), "1000 -> 2000 samples/s")
    return Decision(Excluded(1), forecast, "rank 1 left out")


def _job(spec: JobSpec, total_steps: int | None) -> JobRow:
    return JobRow(global_batch=spec.global_batch, total_steps=total_steps)


@pytest.mark.parametrize(
    ("step", "start_up_s", "pays"),
    [
        (32, 5.0, True),  # 968 steps left save 7.74 s > 5.03 s
        (400, 5.0, False),  # 600 steps left save 4.8 s: a restart would not win it back
        (32, None, False),  # no start-up measured yet: the assumed 30 s is not won back
        (996, 0.0, False),  # 4 steps left save 32 ms < the 4 steps run again
    ],
)
def test_a_restart_happens_only_when_the_steps_left_win_back_its_cost(
    step: int, start_up_s: float | None, pays: bool
) -> None:
    spec = parse_jobspec(SPEC.format(steps=1000))
    decided = paying(_decision(), spec, _job(spec, 1000), step, start_up_s)
    assert (decided is not None) is pays
    if decided is not None:
        assert decided.message.startswith("rank 1 left out; over the 968 steps left")
        assert "saves 7.7 s against a restart of 5.0 s (start-up measured 5.0 s" in decided.message


def test_an_unmeasured_start_up_is_assumed_and_said_so() -> None:
    spec = parse_jobspec(SPEC.format(steps=100_000))
    decided = paying(_decision(), spec, _job(spec, 100_000), 32, None)
    assert decided is not None
    assert f"start-up not yet measured, assumed {UNMEASURED_START_UP_S:.1f} s" in decided.message


def test_an_open_ended_job_keeps_the_decision_as_it_was() -> None:
    spec = parse_jobspec(SPEC.format(steps=1000))
    assert paying(_decision(), spec, _job(spec, None), 32, 5.0) == _decision()
