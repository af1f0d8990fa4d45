"""The GPU tier (``make test-gpu``): tests marked ``gpu`` need two or more CUDA devices.

Elsewhere every one of them is skipped with one reason, so ``make test`` on a
CPU machine stays as it is. With ``HETERO_GPU_SUMMARY=FILE`` set (``make
test-gpu`` sets it) a run on a GPU host writes its summary there: date,
hardware, software, each test's outcome and the duration.
"""

from __future__ import annotations

import datetime
import os
import platform
import time
from pathlib import Path
from typing import Any

import pytest

MIN_GPUS = 2


def cuda_devices() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken driver is "no GPU" for this purpose
        return 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    found = cuda_devices()
    if found >= MIN_GPUS:
        return
    skip = pytest.mark.skip(
        reason=f"GPU tier: needs {MIN_GPUS} or more CUDA devices, found {found}"
    )
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


_started = time.monotonic()
_outcomes: dict[str, str] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "gpu" not in report.keywords:
        return
    if report.when == "call" or report.outcome != "passed":
        _outcomes.setdefault(report.nodeid, report.outcome)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    target = os.environ.get("HETERO_GPU_SUMMARY")
    if not target or cuda_devices() < MIN_GPUS or not _outcomes:
        return
    Path(target).write_text(summary(_outcomes, time.monotonic() - _started))


def summary(outcomes: dict[str, str], duration_s: float) -> str:
    """The run as markdown: what ran where, and how it ended."""
    import torch

    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    counts = {
        k: sum(1 for v in outcomes.values() if v == k) for k in ("passed", "failed", "skipped")
    }
    lines = [
        "# The GPU tier's last run",
        "",
        f"- date: {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}",
        f"- hardware: {len(names)}x {', '.join(sorted(set(names)))}; {os.cpu_count()} CPU cores; "
        f"driver {_driver()}",
        f"- software: python {platform.python_version()}, torch {torch.__version__}, "
        f"CUDA {torch.version.cuda}",
        "- command: `make test-gpu`",
        f"- result: {counts['passed']} passed, {counts['failed']} failed, "
        f"{counts['skipped']} skipped in {duration_s:.0f} s",
        "",
        "| test | outcome |",
        "| --- | --- |",
    ]
    lines += [f"| `{nodeid}` | {outcome} |" for nodeid, outcome in sorted(outcomes.items())]
    return "\n".join(lines) + "\n"


def _driver() -> Any:
    from hetero.core.nvml import Nvml

    return Nvml().call("driver", lambda m: m.nvmlSystemGetDriverVersion()) or "n/a"
