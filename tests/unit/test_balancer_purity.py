"""The balancer is pure: the trainer embeds it, so it must not drag in heavy or server deps."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_balancer_loads_no_grpc_torch_sqlalchemy_or_bench() -> None:
    code = (
        "import sys, hetero.core.balancer\n"
        "bad = [m for m in ('grpc', 'torch', 'sqlalchemy', 'hetero.bench', 'yaml', 'rich')"
        " if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ""
