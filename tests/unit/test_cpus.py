"""``core.cpus.usable``: the CPUs the kernel lets this process run on, not the host's."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hetero.core import cpus


def test_usable_counts_the_cpus_this_process_may_run_on() -> None:
    assert cpus.usable() == len(os.sched_getaffinity(0))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to pin to one")
def test_a_process_pinned_to_one_cpu_sees_one() -> None:
    first = min(os.sched_getaffinity(0))
    code = (
        f"import os; os.sched_setaffinity(0, {{{first}}}); "
        "from hetero.core import cpus; print(cpus.usable(), os.cpu_count())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    usable, host = map(int, done.stdout.split())
    assert usable == 1 and host >= 2
