"""Text formatting for hetero-top: numbers with units, ages, sparklines, stacked bars.

Pure functions returning ``str`` or ``rich.text.Text`` (rich, not Textual: the
core stays importable without the UI). Anything unknown prints as ``NA``.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

NA = "n/a"
SPARK = "▁▂▃▄▅▆▇█"

#: Step phases in the order they happen, with the colour each is drawn in.
PHASE_STYLES: tuple[tuple[str, str], ...] = (
    ("data", "magenta"),
    ("forward", "green"),
    ("backward", "dark_green"),
    ("comm", "yellow"),
    ("optimizer", "cyan"),
)


def age(seconds: float | None) -> str:
    """``"3s"``, ``"4m"``, ``"2h"``, ``"1d"``: the age of a heartbeat or event."""
    if seconds is None:
        return NA
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size:
            return f"{seconds // size:.0f}{unit}"
    return f"{seconds:.0f}s"


def gib(n: float | None) -> str:
    if n is None:
        return NA
    return f"{n / 2**30:.1f}G" if n < 100 * 2**30 else f"{n / 2**30:.0f}G"


def percent(value: float | None) -> str:
    return NA if value is None else f"{value:.0f}%"


def celsius(value: float | None) -> str:
    return NA if value is None else f"{value:.0f}°C"


def watts(value: float | None) -> str:
    return NA if value is None else f"{value:.0f}W"


def rate(samples_per_s: float | None) -> str:
    """Samples per second, three significant digits: ``"1.29k"``, ``"674"``, ``"3.20"``."""
    if samples_per_s is None:
        return NA
    v = samples_per_s
    if v >= 1e6:
        return f"{v / 1e6:.3g}M"
    if v >= 1e3:
        return f"{v / 1e3:.3g}k"
    return f"{v:.3g}"


def millis(seconds: float | None) -> str:
    if seconds is None:
        return NA
    ms = seconds * 1e3
    return f"{ms:.3g}ms" if ms < 100 else f"{ms:.0f}ms"


def stretch(values: Sequence[float], width: int) -> list[float]:
    """Each value repeated so a short series fills ``width`` columns (whole repeats only)."""
    n = len(values)
    k = width // n if 0 < n < width else 1
    return [v for v in values for _ in range(k)]


def sparkline(
    values: Sequence[float], width: int, lo: float | None = None, hi: float | None = None
) -> str:
    """The last ``width`` values as block characters, scaled to [lo, hi] (default: their
    own range; a flat series sits at the bottom). Left-padded to ``width``."""
    tail = list(values)[-width:] if width > 0 else []
    if not tail:
        return " " * max(width, 0)
    low = min(tail) if lo is None else lo
    high = max(tail) if hi is None else hi
    span = high - low
    chars = []
    for v in tail:
        frac = 0.0 if span <= 0 else (min(max(v, low), high) - low) / span
        chars.append(SPARK[min(int(frac * len(SPARK)), len(SPARK) - 1)])
    return "".join(chars).rjust(width)


def stacked_bar(parts: Sequence[tuple[float, str]], total: float, width: int) -> Text:
    """A bar ``width`` cells long for ``total`` seconds, one coloured run per
    ``(seconds, style)`` part. Cells are shared out by largest remainder, so the
    runs add up to the bar's length exactly and short phases keep a cell only if
    they earn one."""
    bar = Text()
    if total <= 0 or width <= 0:
        return bar
    used = sum(max(p, 0.0) for p, _ in parts)
    cells = round(width * min(used / total, 1.0))
    exact = [max(p, 0.0) / used * cells if used > 0 else 0.0 for p, _ in parts]
    counts = [int(x) for x in exact]
    order = sorted(range(len(parts)), key=lambda i: exact[i] - counts[i], reverse=True)
    for i in order[: cells - sum(counts)]:
        counts[i] += 1
    for n, (_, style) in zip(counts, parts, strict=True):
        if n:
            bar.append("█" * n, style=style)
    return bar


def usage_bar(fraction: float | None, width: int) -> Text:
    """``▕███▌   ▏``-style gauge of a fraction in [0, 1]; red above 90%."""
    if fraction is None:
        return Text(NA.ljust(width), style="dim")
    frac = min(max(fraction, 0.0), 1.0)
    filled = round(frac * width)
    style = "red" if frac > 0.9 else "yellow" if frac > 0.7 else "green"
    return Text("█" * filled, style=style) + Text("·" * (width - filled), style="dim")


def area_chart(values: Sequence[float], width: int, height: int) -> list[str]:
    """The last ``width`` values as a ``height``-row block chart (top row first),
    scaled from their minimum to their maximum; eighth-cell resolution."""
    tail = list(values)[-width:] if width > 0 else []
    if not tail or height <= 0:
        return [" " * max(width, 0)] * max(height, 0)
    low, high = min(tail), max(tail)
    span = high - low
    levels = [
        (height * 8 if span <= 0 else round((v - low) / span * (height * 8 - 1)) + 1) for v in tail
    ]
    rows = []
    for row in range(height - 1, -1, -1):
        cells = [" ▁▂▃▄▅▆▇█"[min(max(lv - row * 8, 0), 8)] for lv in levels]
        rows.append("".join(cells).rjust(width))
    return rows
