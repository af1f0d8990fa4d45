"""What the store's table groups share: the error for a row that is not there, and a
model's Core ``Table`` for the bulk statements."""

from __future__ import annotations

from typing import cast

from sqlalchemy import Table

from hetero.coordinator.models import IntervalStatRow, NodeRow, TelemetryRow
from hetero.core.errors import HeteroError


class NotFoundError(HeteroError):
    grpc_code = "NOT_FOUND"


def table(model: type[NodeRow] | type[TelemetryRow] | type[IntervalStatRow]) -> Table:
    return cast(Table, model.__table__)
