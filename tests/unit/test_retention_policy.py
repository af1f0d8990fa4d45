"""The retention policies are pure: hetero-agent imports coordinator.config (for the
state directory), which builds them, so they must not drag in the coordinator's store."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_coordinator_config_loads_no_store_grpc_or_torch() -> None:
    code = (
        "import sys, hetero.coordinator.config\n"
        "bad = [m for m in ('grpc', 'torch', 'hetero.coordinator.store',"
        " 'hetero.coordinator.pruning', 'hetero.v1') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ""
