"""How the coordinator keeps telemetry: one row per (node, device, bucket of
``period_s``), the first sample of each bucket (``service.Service.keep_telemetry``),
kept for ``retention_s``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TelemetryPolicy:
    """Downsampling and retention of telemetry, in seconds."""

    period_s: float = 10.0
    retention_s: float = 24 * 3600.0
