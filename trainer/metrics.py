"""Per-rank metrics as JSON lines, one record per interval.

File: ``<output_dir>/metrics/rank<R>.jsonl``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TextIO


class MetricsWriter:
    """Appends one JSON object per line and flushes, so a crash loses at most one record."""

    def __init__(self, output_dir: Path | None, rank: int) -> None:
        self.path: Path | None = None
        self._fh: TextIO | None = None
        if output_dir is not None:
            self.path = Path(output_dir) / "metrics" / f"rank{rank}.jsonl"
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = self.path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        if self._fh is not None:
            self._fh.write(json.dumps(record, separators=(",", ":")) + "\n")
            self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All records of one rank's metrics file."""
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]
