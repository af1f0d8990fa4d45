"""A ``command:`` job's script and its job file agree, or the job fails in one line
(issue #34: a script that asked ``ctx.loader`` for 256 while the file said 128 ran to
SUCCEEDED on equal batches, ignoring every plan). A real coordinator and agent run the
repository's example loop, which takes the job's terms (``ctx.job``), and a script that
asks for another global batch."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from hetero.bench.localcluster import AgentSpec, LocalCluster
from hetero.v1 import coordinator_pb2 as pb

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).parents[2] / "examples" / "custom_loop.py"
#: A script that asks for its own global batch, not the file's.
STUBBORN = (
    "import torch; from hetero import trainer as ht; ctx = ht.init(device='cpu'); "
    "ctx.loader(torch.utils.data.TensorDataset(torch.randn(64, 2)), 64)"
)
JOB = """\
name: {name}
command: {command}
global_batch: 24
steps: 6
policy: equal
rebalance_interval: 3
resources: {{ranks: 2, device: cpu}}
"""


def test_a_command_job_takes_its_terms_from_the_job_file_or_fails_naming_both(
    tmp_path: Path,
) -> None:
    with LocalCluster(tmp_path / "cluster", [AgentSpec("node-a"), AgentSpec("node-b")]) as cluster:
        example = [sys.executable, str(EXAMPLE)]
        kept = cluster.submit(JOB.format(name="keeps-terms", command=json.dumps(example)))
        stubborn = [sys.executable, "-c", STUBBORN]
        refused = cluster.submit(JOB.format(name="own-terms", command=json.dumps(stubborn)))
        done = cluster.wait(kept, timeout_s=180)
        failed = cluster.wait(refused, timeout_s=180)
        kept_logs = "\n".join(line.text for line in cluster.logs(kept))
        refused_logs = [line.text for line in cluster.logs(refused)]
    assert done.state == pb.JOB_STATE_SUCCEEDED, (done.message, kept_logs[-2000:])
    assert "done: 6 steps, final plan [12, 12]" in kept_logs  # the file's 24 and its 6 steps
    assert failed.state == pb.JOB_STATE_FAILED
    want = (
        "error: ctx.loader: global_batch=64, but job 'own-terms' says global_batch: 24 "
        "(leave it out to take the job's, or make the two agree)"
    )
    assert any(line.endswith(want) for line in refused_logs), refused_logs[-20:]
    assert not any("Traceback" in line for line in refused_logs), refused_logs[-20:]
