"""Who a call to the coordinator is, as far as its credentials tell (docs/deploy.md#roles).

A :class:`Caller` carries the name a job's owner is recorded under and the
queue's ``jobs_per_user`` limit counts by (``label``), the node or user a named
credential binds it to (``named``), and, for a caller known by its client
certificate alone, the methods its mapped role may call (``methods``; a token's
methods were already checked by the token interceptor).

Where the name comes from, first match wins:

- a token the coordinator knows: the cluster token ("cluster token"), a role
  token ("user token", "agent token", "read token": every holder of one shares
  its name and budget), a node's or a user's credential ("node:gpu-3",
  "user:ana", ``hetero.security.credentials``);
- a verified client certificate (mutual TLS) whose common name
  ``certificates:`` maps to a role: the name that mapping gives, so user ana
  is "user:ana" by certificate or by token alike; a common name the mapping
  lacks may call nothing; without a mapping every certificate may call
  everything, as before roles, and is named "certificate CN=...";
- else "anyone" (a coordinator with no authentication at all, ``--insecure``).

Never the token itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hetero.security.auth import RoleToken, Secret, bearer
from hetero.security.credentials import Named, NamedCredentials

ANYONE = "anyone"
#: The ``auth_context`` key gRPC gives a verified client certificate's common name under.
CERT_NAME_KEY = "x509_common_name"


@dataclass(frozen=True)
class Caller:
    """Who calls: ``label`` names it (a job's owner); ``named`` binds it to one node or
    user; ``methods`` (full gRPC names) limits what it may call, None = no limit here."""

    label: str
    named: Named | None = None
    methods: frozenset[str] | None = None
    #: The role a certificate maps to, for refusals ("read"); "" for a token.
    role: str = ""

    @property
    def scoped(self) -> bool:
        """Whether the coordinator must check this call against its caller (``scope``)."""
        return self.named is not None or self.methods is not None


UNRESTRICTED = Caller(ANYONE)


class Identities:
    """The :class:`Caller` of a call, from its metadata and ``auth_context``.

    ``certificates`` maps a certificate's common name to the caller it is (built by
    ``roles.certificate_callers``); empty = certificates are not mapped."""

    def __init__(
        self,
        token: Secret | None = None,
        roles: Sequence[RoleToken] = (),
        named: NamedCredentials | None = None,
        certificates: Mapping[str, Caller] | None = None,
    ) -> None:
        self._token = token
        self._roles = tuple(roles)
        self._named = named
        self._certificates = dict(certificates or {})

    def of(
        self,
        metadata: Iterable[tuple[str, Any]] | None,
        auth_context: Mapping[str, Iterable[bytes]] | None = None,
    ) -> Caller:
        presented = bearer(metadata)
        if presented is not None:
            if self._token is not None and self._token.matches(presented):
                return Caller("cluster token")
            for role in self._roles:
                if role.token.matches(presented):
                    return Caller(f"{role.role} token")
            who = self._named.verify(presented) if self._named is not None else None
            if who is not None:
                return Caller(who.label, named=who)
        names = list((auth_context or {}).get(CERT_NAME_KEY, ()))
        if names:
            common_name = names[0].decode("utf-8", errors="replace")[:200]
            if not self._certificates:
                return Caller("certificate CN=" + common_name)
            unmapped = Caller(f"certificate CN={common_name}", methods=frozenset(), role="no")
            return self._certificates.get(common_name, unmapped)
        return UNRESTRICTED
