"""The log caps' ledger (``coordinator.logcaps``): what it admits never passes a cap but
by one note a job, it drops only the newest lines of a batch, and a gap counts what it
dropped."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hetero.coordinator.logcaps import NOTE_COST, KiB, LogCaps, LogLedger, line_cost, size_text
from hetero.core.errors import ConfigError

CAPS = LogCaps(per_job=64 * KiB, per_user=128 * KiB, total=192 * KiB)

batches = st.lists(
    st.tuples(
        st.sampled_from(["j1", "j2", "j3", "j4"]),
        st.lists(st.tuples(st.integers(0, 3), st.integers(0, 16384)), max_size=40),
    ),
    max_size=40,
)
#: Each job's owner: two users, two jobs each.
OWNERS = {"j1": "user:ana", "j2": "user:ana", "j3": "user:bob", "j4": "user:bob"}


@given(batches)
def test_no_cap_is_passed_but_by_one_note_a_job_and_only_the_newest_lines_go(
    sent: list[tuple[str, list[tuple[int, int]]]],
) -> None:
    ledger = LogLedger()
    dropped: dict[str, tuple[int, int]] = {}
    for job_id, lines in sent:
        admitted = ledger.admit(CAPS, job_id, OWNERS[job_id], lines)
        kept = lines[: admitted.kept]
        assert admitted.kept_cost == sum(line_cost(n) for _, n in kept)
        rest = lines[admitted.kept :]
        assert (admitted.gap is None) == (not rest)
        if admitted.gap is not None:
            before = (0, 0) if admitted.opened else dropped[job_id]
            dropped[job_id] = (before[0] + sum(n for _, n in rest), before[1] + len(rest))
            assert (admitted.gap.text_bytes, admitted.gap.lines) == dropped[job_id]
            assert admitted.gap.rank == (rest[0][0] if admitted.opened else admitted.gap.rank)
        elif admitted.kept:
            dropped.pop(job_id, None)  # the gap ended
    for job_id, job in ledger.jobs.items():
        assert job.stored <= CAPS.per_job + NOTE_COST, job_id
    for owner in ("user:ana", "user:bob"):
        assert ledger.owners.get(owner, 0) <= CAPS.per_user + 2 * NOTE_COST
    assert ledger.total <= CAPS.total + 4 * NOTE_COST
    assert ledger.total == sum(j.stored for j in ledger.jobs.values())


def test_released_and_forgotten_bytes_make_room_again() -> None:
    ledger = LogLedger()
    line = (0, 8192)
    full = ledger.admit(CAPS, "j1", "user:ana", [line] * 10)
    assert full.kept == 7 and full.gap is not None and "log_bytes_per_job" in full.gap.cause
    ledger.release({"j1": full.kept_cost})
    assert ledger.admit(CAPS, "j1", "user:ana", [line]).kept == 1
    ledger.forget(["j1"])
    assert ledger.total == 0 and ledger.owners == {}


@pytest.mark.parametrize(
    ("caps", "message"),
    [
        ({"per_job": 1024}, "log_bytes_per_job must be a whole number of bytes >= 65536"),
        ({"per_job": 1 << 20, "per_user": 1 << 19}, "must grow from job to user to total"),
        ({"total": True}, "log_bytes_total must be a whole number of bytes"),
    ],
)
def test_caps_out_of_range_are_config_errors_naming_the_key(
    caps: dict[str, int], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        LogCaps(**caps)


def test_sizes_read_as_people_write_them() -> None:
    assert [size_text(n) for n in (812, 64 * KiB, 1_258_291, 1 << 30)] == [
        "812 B",
        "64 KiB",
        "1.2 MiB",
        "1 GiB",
    ]
