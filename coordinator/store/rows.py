"""What the store's table groups share: the error for a row that is not there."""

from __future__ import annotations

from hetero.core.errors import HeteroError


class NotFoundError(HeteroError):
    grpc_code = "NOT_FOUND"
