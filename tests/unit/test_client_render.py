"""``hetero-coord``'s tables as a pipe or a narrow terminal shows them."""

from __future__ import annotations

from rich.console import Console

from hetero.client import render
from hetero.v1 import coordinator_pb2 as pb


def test_the_jobs_table_keeps_a_job_id_whole_in_a_narrow_pipe() -> None:
    """``hetero-coord jobs`` piped (80 columns) cut the id to '7feb…', the one field the
    next command needs (issue #34)."""
    jobs = [
        pb.Job(
            id="7feb0c1d2e3f",
            name="a-rather-long-job-name-" * 3,
            owner="user:somebody",
            policy="dynamic",
        )
    ]
    console = Console(width=60, file=None, force_terminal=False, record=True)
    console.print(render.jobs_table(jobs))
    assert "7feb0c1d2e3f" in console.export_text()
