"""Job and rank states are written once, in hetero.core.states, and match the proto."""

from __future__ import annotations

from hetero.coordinator import lifecycle
from hetero.core.states import (
    JOB_TERMINAL,
    TERMINAL_LABELS,
    JobState,
    RankState,
    job_label,
    job_terminal,
    rank_label,
)
from hetero.v1 import coordinator_pb2 as pb


def test_the_states_are_the_proto_enums_by_name_and_number() -> None:
    # A state added to the proto without one in core (or the reverse) fails here.
    proto_jobs = {n.removeprefix("JOB_STATE_"): v for n, v in pb.JobState.items()}
    proto_ranks = {n.removeprefix("RANK_STATE_"): v for n, v in pb.RankState.items()}
    assert {s.name: s.value for s in JobState} == proto_jobs
    assert {s.name: s.value for s in RankState} == proto_ranks


def test_succeeded_failed_and_cancelled_are_the_terminal_job_states() -> None:
    assert {s for s in JobState if s.is_terminal} == JOB_TERMINAL
    assert {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED} == JOB_TERMINAL
    assert job_terminal(pb.JOB_STATE_CANCELLED) and not job_terminal(pb.JOB_STATE_RESTARTING)
    assert not job_terminal(99)  # a newer coordinator's state
    assert {"succeeded", "failed", "cancelled"} == TERMINAL_LABELS
    assert {"SUCCEEDED", "FAILED", "CANCELLED"} == lifecycle.FINISHED


def test_an_exited_rank_is_terminal_and_the_others_may_be_live() -> None:
    assert [s for s in RankState if s.is_terminal] == [RankState.EXITED]
    assert {s for s in RankState if s.is_live} == {
        RankState.ASSIGNED,
        RankState.RUNNING,
        RankState.STOPPING,
    }


def test_labels_are_lower_case_names_and_unknown_numbers_still_read() -> None:
    assert job_label(pb.JOB_STATE_RUNNING) == "running"
    assert rank_label(pb.RANK_STATE_STOPPING) == "stopping"
    assert job_label(42) == "state 42" and rank_label(42) == "state 42"
