"""Who may reach the coordinator, from its config: the role tokens, node and user
credentials, and client certificates mapped to roles; and ``hetero-coord
node-token`` / ``user-token``, which print a node's or a user's credential.

The credential secret (``hetero.security.credentials``) lives in the state directory as
``credential-secret`` (0600), made by the coordinator at its first start or by
the first ``node-token``/``user-token``, whichever comes first; or in the file
``credentials.secret_file`` names, which must then exist. Node and user
credentials are accepted beside the cluster token, never instead of it: a
coordinator given no token still generates one for its local clients, and one
listening beyond loopback still needs a token, role tokens or mutual TLS
configured (``transport.check_listen``). With ``--insecure`` and no token no
credential is checked at all.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from hetero.coordinator.config import CoordinatorConfig, load_config, with_flags
from hetero.coordinator.identity import Caller
from hetero.coordinator.roles import certificate_callers, named_credentials
from hetero.core.errors import ConfigError
from hetero.security.credentials import SECRET_FILE_NAME, check_name, load_secret
from hetero.security.permissions import private_dir
from hetero.security.transport import ServerSecurity


def _secret_file(config: CoordinatorConfig) -> Path:
    """The credential secret's file, made (0600) if it is the default one and missing."""
    path = config.resolved_credential_secret
    if config.credential_secret_file is None:
        private_dir(path.parent)
        load_secret(path, create=True)
    elif not path.exists():
        raise ConfigError(
            f"credentials.secret_file {path} does not exist (make one: "
            f"openssl rand -hex 32 > {path} && chmod 600 {path})"
        )
    return path


def with_access(
    config: CoordinatorConfig, security: ServerSecurity
) -> tuple[ServerSecurity, dict[str, Caller]]:
    """``security`` (its token and role tokens set) with node and user credentials,
    unless ``--insecure`` left the coordinator without any token; and the certificate
    mapping by common name (empty without ``certificates:``)."""
    certificates = certificate_callers(config.certificates)
    if certificates and not security.mutual_tls:
        raise ConfigError("certificates: needs mutual TLS (tls_cert, tls_key and tls_ca)")
    if security.insecure and not security.authenticated:
        return security, certificates
    named = named_credentials(_secret_file(config), config.revoked)
    # A call with a certificate and no token passes the token check where it did before
    # (mutual TLS without a token or role tokens: the certificate was the credential),
    # and where ``certificates:`` maps it to a role.
    tokenless = bool(certificates) or (security.token is None and not security.roles)
    return replace(security, named=named, certificate_callers=tokenless), certificates


# ---- node-token, user-token ----------------------------------------------------------


#: Per kind: who holds the credential, what it binds them to, an example name.
_COMMANDS = {
    "node": ("an agent", "it may register, heartbeat and report only as that node", "gpu-node-3"),
    "user": ("a person", "they may submit, read, and cancel only their own jobs", "ana"),
}


def add_commands(sub: argparse._SubParsersAction[Any]) -> None:
    """The ``node-token`` and ``user-token`` subcommands."""
    for kind, (holder, binds, example) in _COMMANDS.items():
        p = sub.add_parser(
            f"{kind}-token",
            help=f"print the credential of one {kind} (run on the coordinator's host)",
            description=f"Print the credential that binds {holder} to {kind} NAME: {binds}. "
            f"It is derived from the coordinator's credential secret ({SECRET_FILE_NAME} in "
            "its state directory, or credentials.secret_file; made here if missing), so "
            "nothing is stored and the same NAME always gives the same credential. Run it as "
            "the coordinator's user. Withdraw one with credentials.revoked in coordinator.yaml "
            "(docs/deploy.md#roles).",
            epilog=f"example: hetero-coord {kind}-token {example} --state-dir /var/lib/hetero "
            f"--out {example}.token",
        )
        hostname = " (agent.yaml name:, default its hostname)" if kind == "node" else ""
        p.add_argument("name", help=f"the {kind}'s name{hostname}")
        p.add_argument("--config", type=Path, help="the coordinator's YAML config")
        p.add_argument("--state-dir", type=Path, help="the coordinator's state directory")
        p.add_argument(
            "--out", type=Path, help="write it to this file (mode 0600) instead of stdout"
        )


def print_credential(args: argparse.Namespace) -> int:
    """``node-token``/``user-token``: the credential of ``args.name``, on stdout or to ``--out``."""
    kind = args.command.removesuffix("-token")
    check_name(kind, args.name)
    config = with_flags(load_config(args.config), state_dir=args.state_dir)
    credentials = named_credentials(_secret_file(config))
    assert credentials is not None  # _secret_file made it
    token = credentials.mint(kind, args.name).reveal()
    if args.out is None:
        print(token)
        return 0
    try:
        fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # an existing file keeps its mode otherwise
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(token + "\n")
    except OSError as exc:
        raise ConfigError(f"cannot write {args.out}: {exc.strerror}") from None
    print(f"{kind} {args.name}: credential written to {args.out}", file=sys.stderr)
    return 0
