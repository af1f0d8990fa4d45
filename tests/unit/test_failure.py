"""The failure line the coordinator writes names the rank ``submit --wait`` reads back."""

from __future__ import annotations

from hetero.coordinator.lifecycle import RankStatus, job_state
from hetero.core.failure import failed_rank, rank_exit_cause


def test_the_rank_a_failure_names_is_read_back_from_every_form_of_the_message() -> None:
    ranks = [RankStatus(0, "RUNNING"), RankStatus(3, "EXITED", 137, "watchdog: no progress")]
    assert failed_rank(job_state("RUNNING", ranks).message) == 3
    assert failed_rank(job_state("RUNNING", ranks, 0, 2).message) == 3  # a restart's
    assert failed_rank(job_state("RUNNING", ranks, 2, 2).message) == 3  # no restart left
    assert failed_rank(rank_exit_cause(12, -1)) == 12


def test_a_failure_no_rank_exit_caused_names_no_rank() -> None:
    assert failed_rank("node gpu-b went down (ranks 1, 2)") is None
    assert failed_rank("job cancelled") is None
    assert failed_rank("") is None
