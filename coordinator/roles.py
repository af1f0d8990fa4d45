"""Which coordinator methods each role's token may call (docs/deploy.md#roles).

The cluster token (``token_file``) may call everything, as before roles. Beside
it, ``coordinator.yaml`` may name one token file per role:

- ``user``: submit, cancel and drain, and everything ``read`` may;
- ``agent``: what an agent calls: register, heartbeat, orders, rank states, logs,
  and the trainers' statistics and plans it forwards;
- ``read``: list and watch only (``hetero-top``, dashboards, Prometheus).

So a user's token can no longer re-register a node, forge a rank's exit or
append log lines as a rank, and an agent's token can no longer submit a job.
The sets are written out method by method, and a test checks that they cover
every method of the service, so a new RPC cannot slip into a role unreviewed.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from hetero.auth import RoleToken, read_token_file
from hetero.core.errors import ConfigError
from hetero.v1 import coordinator_pb2

SERVICE = coordinator_pb2.DESCRIPTOR.services_by_name["Coordinator"]


def _full(names: Iterable[str]) -> frozenset[str]:
    return frozenset(f"/{SERVICE.full_name}/{n}" for n in names)


READ = _full(("ListJobs", "GetJob", "GetJobLogs", "ListNodes", "GetJobDetail", "WatchCluster"))
USER = READ | _full(("SubmitJob", "CancelJob", "DrainNode", "Probe"))
AGENT = _full(
    (
        "RegisterNode",
        "Heartbeat",
        "PollAssignments",
        "ReportRankStatus",
        "AppendJobLogs",
        "Probe",
        "ReportIntervalStats",
        "GetPlan",
    )
)
#: Role name -> the methods its token may call.
ROLES: dict[str, frozenset[str]] = {"user": USER, "agent": AGENT, "read": READ}


def load_roles(files: Iterable[tuple[str, Path]]) -> tuple[RoleToken, ...]:
    """The role tokens named in ``roles:`` of coordinator.yaml (role, token file)."""
    tokens: list[RoleToken] = []
    for role, path in files:
        if role not in ROLES:
            known = ", ".join(ROLES)
            raise ConfigError(f"roles: unknown role {role!r} (known: {known})")
        tokens.append(RoleToken(role, read_token_file(path), ROLES[role]))
    seen: set[str] = set()
    for t in tokens:
        if t.token.reveal() in seen:
            raise ConfigError(f"roles: the {t.role} token is the same as another role's")
        seen.add(t.token.reveal())
    return tuple(tokens)
