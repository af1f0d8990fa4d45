"""Who a call to the coordinator is, as far as its credentials tell: the name the
queue's ``jobs_per_user`` limit counts jobs under.

The roles layer (``roles``) has one credential per role, not per person: the
cluster token, and the ``user``, ``agent`` and ``read`` tokens. So today the
identity is the credential: every holder of the user token shares one
``jobs_per_user`` budget, and so does every holder of the cluster token. A
client certificate (mutual TLS) is personal, so a call that presents one is
counted under its subject's common name instead. A coordinator with no
authentication at all (``--insecure``) has one caller, "anyone".

Never the token itself: the names are "cluster token", "user token",
"certificate CN=ana", "anyone".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hetero.auth import RoleToken, Secret, bearer

ANYONE = "anyone"
#: The ``auth_context`` key gRPC gives a verified client certificate's common name under.
CERT_NAME_KEY = "x509_common_name"


class Identities:
    """The name of a call's credential, from its metadata and ``auth_context``."""

    def __init__(self, token: Secret | None = None, roles: Sequence[RoleToken] = ()) -> None:
        self._token = token
        self._roles = tuple(roles)

    def of(
        self,
        metadata: Iterable[tuple[str, Any]] | None,
        auth_context: Mapping[str, Iterable[bytes]] | None = None,
    ) -> str:
        names = list((auth_context or {}).get(CERT_NAME_KEY, ()))
        if names:
            return "certificate CN=" + names[0].decode("utf-8", errors="replace")[:200]
        presented = bearer(metadata)
        if presented is not None:
            if self._token is not None and self._token.matches(presented):
                return "cluster token"
            for role in self._roles:
                if role.token.matches(presented):
                    return f"{role.role} token"
        return ANYONE
