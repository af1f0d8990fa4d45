"""Credentials that name their holder: one node's or one user's token, derived, not stored.

A named credential reads ``node:NAME:MAC`` or ``user:NAME:MAC``, where MAC is
HMAC-SHA256 of the coordinator's credential secret and ``KIND:NAME``, in hex.
The coordinator checks the MAC in constant time and then knows who calls: the
name travels in the token, and only the holder of the secret could have made
the MAC for it. ``hetero-coord node-token NAME`` and ``user-token NAME`` print
one (docs/deploy.md#roles).

Why derived rather than one token file per node or user listed in
coordinator.yaml: there is no table to keep in step. Adding a node is one
command on the coordinator's host and one file copied to the node; the
coordinator needs no restart, no reload and no database row, and a credential
cannot exist for a name the secret did not sign. The cost is revocation: a
single credential is withdrawn by naming it under ``credentials.revoked``
(checked on every call), all of them at once by replacing the secret.

What a named caller may then do is the coordinator's rule
(``hetero.coordinator.scope``): a node acts only for its own node, a user
cancels only its own jobs.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from hetero.core.errors import ConfigError
from hetero.security.auth import Secret, ensure_token, read_token_file

#: The kinds of named credential and what each names.
KINDS = ("node", "user")
#: A name a credential may carry: a host name or a login, so never ":" or a space.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
#: Name of the secret's file in the coordinator's state directory, unless configured.
SECRET_FILE_NAME = "credential-secret"


@dataclass(frozen=True)
class Named:
    """Who a named credential says its holder is: ``kind`` ("node" or "user") and ``name``."""

    kind: str
    name: str

    @property
    def label(self) -> str:
        """``node:gpu-3``: how logs, refusals and a job's owner name this holder."""
        return f"{self.kind}:{self.name}"


def check_name(kind: str, name: str) -> Named:
    """``Named(kind, name)`` if a credential may carry it, else a one-line ConfigError."""
    if kind not in KINDS:
        raise ConfigError(f"unknown credential kind {kind!r} (known: {', '.join(KINDS)})")
    if not NAME_PATTERN.fullmatch(name):
        raise ConfigError(
            f"{kind} name {name!r}: must be 1 to 63 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return Named(kind, name)


def parse(token: str) -> tuple[Named, str] | None:
    """The name a token claims and its MAC, unverified; None if it is not a named credential."""
    kind, sep, rest = token.partition(":")
    name, sep2, mac = rest.rpartition(":")
    if not (sep and sep2) or kind not in KINDS or not NAME_PATTERN.fullmatch(name):
        return None
    return Named(kind, name), mac


class NamedCredentials:
    """Mints and verifies named credentials with one secret.

    ``methods`` maps a kind to the full gRPC method names its credentials may call
    (``/pkg.Service/Method``); ``revoked`` holds labels (``node:gpu-3``) no longer
    accepted."""

    __slots__ = ("_key", "methods", "revoked")

    def __init__(
        self,
        secret: Secret,
        methods: Mapping[str, frozenset[str]] | None = None,
        revoked: Iterable[str] = (),
    ) -> None:
        self._key = secret.reveal().encode("utf-8")
        self.methods = dict(methods or {})
        self.revoked = frozenset(revoked)

    def mint(self, kind: str, name: str) -> Secret:
        """The credential of ``name`` (checked with :func:`check_name`)."""
        who = check_name(kind, name)
        return Secret(f"{who.label}:{self._mac(who)}")

    def verify(self, presented: str) -> Named | None:
        """Who ``presented`` names if its MAC is right and it is not revoked, else None."""
        claim = parse(presented)
        if claim is None:
            return None
        who, mac = claim
        if not hmac.compare_digest(mac.encode("ascii", "replace"), self._mac(who).encode("ascii")):
            return None
        return None if who.label in self.revoked else who

    def may_call(self, who: Named, method: str) -> bool:
        return method in self.methods.get(who.kind, frozenset())

    def _mac(self, who: Named) -> str:
        return hmac.new(self._key, who.label.encode("utf-8"), hashlib.sha256).hexdigest()

    def __repr__(self) -> str:
        return f"NamedCredentials(kinds={sorted(self.methods)}, revoked={len(self.revoked)})"

    def __reduce__(self) -> NoReturn:
        raise TypeError("credentials are not pickled")


def secret_path(configured: Path | None, state_dir: Path) -> Path:
    """Where the credential secret is: ``configured``, else in ``state_dir``."""
    return configured if configured is not None else state_dir / SECRET_FILE_NAME


def load_secret(path: Path, *, create: bool) -> Secret | None:
    """The secret in ``path``; made first (256 random bits, mode 0600) if ``create`` and
    missing; None if missing and not ``create``."""
    if create:
        return ensure_token(path)
    if not path.exists():
        return None
    return read_token_file(path)


def check_holder(token: Secret | None, kind: str, name: str) -> None:
    """Refuse to start with another holder's named credential: an agent registering as
    node ``name`` given node gpu-4's credential (or a user's) would be refused on every
    call; one line now instead. A cluster or role token passes unchecked."""
    claim = parse(token.reveal()) if token is not None else None
    if claim is None or claim[0] == Named(kind, name):
        return
    who = claim[0]
    raise ConfigError(
        f"the token is {who.kind} {who.name}'s credential, but this {kind} is {name!r}: "
        f"use {kind} {name}'s (hetero-coord {kind}-token {name}) or set its name to {who.name}"
    )
