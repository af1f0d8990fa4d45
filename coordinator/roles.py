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

Beside the shared role tokens, a credential may name its holder
(``hetero.security.credentials``): a node's may call what the agent role may, for its own
node only; a user's what the user role may but ``DrainNode`` (an operator's
act), reading and cancelling its own jobs only (``scope``). A client certificate maps onto
the same roles through ``certificates:`` (:func:`certificate_callers`).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from hetero.coordinator.identity import Caller
from hetero.core.errors import ConfigError
from hetero.security.auth import RoleToken, read_token_file
from hetero.security.credentials import NamedCredentials, check_name, load_secret
from hetero.v1 import coordinator_pb2

SERVICE = coordinator_pb2.DESCRIPTOR.services_by_name["Coordinator"]


def _full(names: Iterable[str]) -> frozenset[str]:
    return frozenset(f"/{SERVICE.full_name}/{n}" for n in names)


READ = _full(("ListJobs", "GetJob", "GetJobLogs", "ListNodes", "GetJobDetail", "WatchCluster"))
#: A user may also attach a job its own launcher started and report for it (``attach``;
#: ``scope`` keeps it to such jobs).
USER = READ | _full(
    (
        "SubmitJob",
        "CancelJob",
        "DrainNode",
        "Probe",
        "AttachJob",
        "DetachJob",
        "ReportIntervalStats",
        "GetPlan",
    )
)
AGENT = _full(
    (
        "RegisterNode",
        "Heartbeat",
        "WatchOrders",
        "ReportPeerLinks",
        "ReportRankStatus",
        "AppendJobLogs",
        "Probe",
        "ReportIntervalStats",
        "GetPlan",
    )
)
#: Role name -> the methods its token may call.
ROLES: dict[str, frozenset[str]] = {"user": USER, "agent": AGENT, "read": READ}
#: Credential kind -> the methods a named credential may call (``scope`` narrows them
#: further to the holder's own node or jobs).
NAMED: dict[str, frozenset[str]] = {"node": AGENT, "user": USER - _full(("DrainNode",))}
#: What ``certificates:`` may map a common name to (beside "node" and "user", named).
CERTIFICATE_ROLES = ("admin", "agent", "read", "node", "user")


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


def named_credentials(path: Path, revoked: Iterable[str] = ()) -> NamedCredentials | None:
    """Node and user credentials signed by the secret in ``path`` (None if it does not
    exist: none were ever made); ``revoked`` labels ("node:gpu-3") are refused."""
    for label in revoked:
        kind, _, name = label.partition(":")
        check_name(kind, name)  # a misspelt revocation must not pass silently
    secret = load_secret(path, create=False)
    return None if secret is None else NamedCredentials(secret, NAMED, revoked)


def certificate_callers(mapping: Iterable[tuple[str, str]]) -> dict[str, Caller]:
    """``certificates: {CN: ROLE}`` of coordinator.yaml as callers by common name. ROLE is
    "admin" (every method), "agent" or "read" (that role token's methods), "node" or
    "user" (the named credential of the common name), or "node:NAME" / "user:NAME"
    (another name than the common name)."""
    callers: dict[str, Caller] = {}
    for common_name, grant in mapping:
        role, _, name = grant.partition(":")
        where = f"certificates.{common_name}"
        if role not in CERTIFICATE_ROLES or (name and role not in NAMED):
            known = ", ".join((*CERTIFICATE_ROLES, "node:NAME", "user:NAME"))
            raise ConfigError(f"{where}: unknown role {grant!r} (known: {known})")
        if role == "admin":
            callers[common_name] = Caller(f"certificate CN={common_name}", role=role)
        elif role in NAMED:
            try:
                who = check_name(role, name or common_name)
            except ConfigError as exc:
                raise ConfigError(f"{where}: {exc}") from None
            callers[common_name] = Caller(who.label, who, NAMED[role], role)
        else:
            label = f"certificate CN={common_name}"
            callers[common_name] = Caller(label, methods=ROLES[role], role=role)
    return callers
