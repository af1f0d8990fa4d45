"""The value kinds of training options: how a value is checked, read from text, written.

A value reaches an option three ways: as Python (an ``ht.train``/``ht.init``
keyword, or a scalar job.yaml gave), or as command-line text (``hetero-train``,
and the argv an agent builds from a launch order). Each kind turns either into
one canonical Python value with the same checks and the same messages, and
writes a canonical value back as the text ``from_text`` reads, so a value
survives coordinator → agent → rank unchanged (a test round-trips every option).

A kind raises :class:`Invalid` with a message that does not name the option;
the option (``hetero.core.catalogue.options``) adds its name in the caller's
spelling.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hetero.core.catalogue.entries import did_you_mean
from hetero.core.errors import ConfigError
from hetero.core.slowdown import parse_slowdowns


class Invalid(ValueError):
    """A value an option refuses; the message says why, without the option's name."""


def short(value: object, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters: an error names a value, not a page of it."""
    try:
        text = repr(value)
    except ValueError:  # an int too long for repr (Python's 4300-digit limit)
        text = "a number too large to show"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def bound(n: float) -> str:
    """A bound for people: ``2^24``, ``10^8``, ``2^63 − 1``, else the number with separators."""
    if n == 2**63 - 1:
        return "2^63 − 1"
    if isinstance(n, int) and n >= 65536 and n & (n - 1) == 0:
        return f"2^{n.bit_length() - 1}"
    if isinstance(n, int) and n >= 10_000 and str(n).rstrip("0") == "1":
        return f"10^{len(str(n)) - 1}"
    return f"{n:,}" if isinstance(n, int) else f"{n:g}"


class Kind:
    """Base of the kinds. ``describe`` gives the type column of the docs; ``metavar`` the CLI's."""

    def describe(self) -> str:
        return "value"

    def metavar(self) -> str:
        return "VALUE"

    def check(self, value: object) -> object:
        """A Python value (keyword or YAML scalar) as the canonical value, or :class:`Invalid`."""
        raise NotImplementedError

    def from_text(self, text: str) -> object:
        """Command-line text as the canonical value."""
        return self.check(text)

    def to_text(self, value: object) -> str:
        """The canonical value as the text :meth:`from_text` reads."""
        return str(value)


@dataclass(frozen=True)
class Int(Kind):
    minimum: int = 0
    maximum: int = 2**31 - 1
    unit: str = ""

    def describe(self) -> str:
        unit = f" ({self.unit})" if self.unit else ""
        return f"integer, {bound(self.minimum)} … {bound(self.maximum)}{unit}"

    def metavar(self) -> str:
        return "N"

    def check(self, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise Invalid(f"must be a whole number, got {short(value)}")
        if value < self.minimum:
            raise Invalid(f"must be >= {self.minimum}, got {short(value)}")
        if value > self.maximum:
            raise Invalid(f"must be <= {self.maximum:,}, got {short(value)}")
        return value

    def from_text(self, text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise Invalid(f"must be a whole number, got {short(text)}") from None
        return self.check(value)


@dataclass(frozen=True)
class Float(Kind):
    """A finite number; ``above``/``below`` are exclusive bounds, ``minimum``/``maximum`` inclusive."""

    minimum: float | None = None
    maximum: float | None = None
    above: float | None = None
    below: float | None = None
    unit: str = ""

    def describe(self) -> str:
        low = (
            f"> {bound(self.above)}"
            if self.above is not None
            else (f">= {bound(self.minimum)}" if self.minimum is not None else "")
        )
        high = (
            f"< {bound(self.below)}"
            if self.below is not None
            else (f"<= {bound(self.maximum)}" if self.maximum is not None else "")
        )
        unit = f" ({self.unit})" if self.unit else ""
        return f"number {' and '.join(x for x in (low, high) if x)}{unit}".rstrip()

    def metavar(self) -> str:
        return "X"

    def check(self, value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise Invalid(f"must be a number, got {short(value)}")
        try:
            out = float(value)
        except OverflowError:
            out = math.inf
        if not math.isfinite(out):
            raise Invalid(f"must be finite, got {short(value)}")
        if self.above is not None and out <= self.above:
            raise Invalid(f"must be > {self.above:g}, got {short(value)}")
        if self.minimum is not None and out < self.minimum:
            raise Invalid(f"must be >= {self.minimum:g}, got {short(value)}")
        if self.below is not None and out >= self.below:
            raise Invalid(f"must be < {self.below:g}, got {short(value)}")
        if self.maximum is not None and out > self.maximum:
            raise Invalid(f"must be <= {self.maximum:g}, got {short(value)}")
        return out

    def from_text(self, text: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            raise Invalid(f"must be a number, got {short(text)}") from None
        return self.check(value)

    def to_text(self, value: object) -> str:
        return repr(float(value))  # type: ignore[arg-type]


_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


class Bool(Kind):
    def describe(self) -> str:
        return "true or false"

    def metavar(self) -> str:
        return "BOOL"

    def check(self, value: object) -> bool:
        if not isinstance(value, bool):
            raise Invalid(f"must be true or false, got {short(value)}")
        return value

    def from_text(self, text: str) -> bool:
        word = text.strip().lower()
        if word in _TRUE or word in _FALSE:
            return word in _TRUE
        raise Invalid(f"must be true or false, got {short(text)}")

    def to_text(self, value: object) -> str:
        return "true" if value else "false"


@dataclass(frozen=True)
class Choice(Kind):
    """One of ``choices``; an alias is accepted and becomes the name it stands for."""

    choices: tuple[str, ...]
    aliases: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        return ", ".join(f"`{c}`" for c in self.choices)

    def metavar(self) -> str:
        return "{" + ",".join(self.choices) + "}"

    def check(self, value: object) -> str:
        if not isinstance(value, str) or not value.strip():
            raise Invalid(f"must be a non-empty string, got {short(value)}")
        value = self.aliases.get(value, value)
        if value not in self.choices:
            hint = did_you_mean(value, self.choices)
            raise Invalid(f"unknown value {short(value)}{hint} (known: {', '.join(self.choices)})")
        return value


@dataclass(frozen=True)
class Switch(Choice):
    """``auto``, ``on`` or ``off``; true and false (as YAML and the older boolean flag
    gave them) are ``on`` and ``off``. On the command line the bare flag is ``on`` and
    ``--no-FLAG`` is ``off``."""

    choices: tuple[str, ...] = ("auto", "on", "off")

    def describe(self) -> str:
        return "`auto`, `on` or `off` (true/false: on/off)"

    def check(self, value: object) -> str:
        if isinstance(value, bool):
            return "on" if value else "off"
        if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
            return "on" if value.strip().lower() in _TRUE else "off"
        return super().check(value)


@dataclass(frozen=True)
class Text(Kind):
    """A non-empty string, optionally matching ``pattern`` (``rule`` says it in words)."""

    pattern: str | None = None
    rule: str = ""
    words: str = "string"
    meta: str = "TEXT"

    def describe(self) -> str:
        return self.words

    def metavar(self) -> str:
        return self.meta

    def check(self, value: object) -> str:
        if not isinstance(value, str) or not value.strip():
            raise Invalid(f"must be a non-empty string, got {short(value)}")
        if self.pattern is not None and not re.fullmatch(self.pattern, value):
            raise Invalid(f"must be {self.rule}, got {short(value[:70])}")
        return value


class PathKind(Kind):
    """A file or directory name; ``pathlib.Path`` is accepted from Python."""

    def describe(self) -> str:
        return "path"

    def metavar(self) -> str:
        return "PATH"

    def check(self, value: object) -> str:
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not isinstance(value, str) or not value.strip():
            raise Invalid(f"must be a path (a non-empty string), got {short(value)}")
        if "\x00" in value:
            raise Invalid("must not contain a NUL character")
        return value


@dataclass(frozen=True)
class ListKind(Kind):
    """Comma-separated items, as on the command line (``64,128,-``); from Python also a
    single item or a sequence. The canonical value is the text, items normalised.

    ``item`` turns one item's text into its normal text, or raises :class:`Invalid`.
    """

    item: Callable[[str], str]
    words: str = "list"
    meta: str = "A,B,..."

    def describe(self) -> str:
        return self.words

    def metavar(self) -> str:
        return self.meta

    def check(self, value: object) -> str:
        if isinstance(value, str):
            parts = value.split(",")
        elif isinstance(value, int | float) and not isinstance(value, bool):
            parts = [str(value)]
        elif isinstance(value, Sequence) and value and all(_scalar(v) for v in value):
            parts = ["-" if v is None else str(v) for v in value]
        else:
            raise Invalid(f"must be {self.words}, got {short(value)}")
        return ",".join(self.item(p.strip()) for p in parts)


def _scalar(v: object) -> bool:
    return v is None or (isinstance(v, int | float | str) and not isinstance(v, bool))


def cap_item(text: str) -> str:
    """A batch cap: a whole number >= 1, or ``-`` (none)."""
    if text in ("-", "", "None"):
        return "-"
    try:
        n = int(text)
    except ValueError:
        raise Invalid(f"expected N or N,N,... (- for no cap), got {short(text)}") from None
    if n < 1:
        raise Invalid(f"caps must be >= 1, got {n}")
    return str(n)


def score_item(text: str) -> str:
    """A relative speed: a finite number > 0."""
    try:
        x = float(text)
    except ValueError:
        raise Invalid(f"must be numbers separated by commas, got {short(text)}") from None
    if not (math.isfinite(x) and x > 0):
        raise Invalid(f"must all be finite and > 0, got {short(text)}")
    return f"{x:g}" if x == float(f"{x:g}") else repr(x)


def fraction_item(text: str) -> str:
    """A share of a device's memory, in (0, 1]."""
    try:
        x = float(text)
    except ValueError:
        raise Invalid(f"expected F or F0,F1,..., got {short(text)}") from None
    if not 0.0 < x <= 1.0:
        raise Invalid(f"values must be in (0, 1], got {short(text)}")
    return repr(x)


class Slowdowns(Kind):
    """``RANK:FACTOR[@START-END],...`` (``hetero.core.slowdown``)."""

    def describe(self) -> str:
        return "`RANK:FACTOR[@START-END],...`, each factor in [1, 100]"

    def metavar(self) -> str:
        return "RANK:FACTOR[@START-END],..."

    def check(self, value: object) -> str:
        if not isinstance(value, str) or not value.strip():
            raise Invalid(f"must be RANK:FACTOR[@START-END],..., got {short(value)}")
        try:
            parse_slowdowns(value)
        except ConfigError as exc:
            raise Invalid(str(exc)) from None
        return value.strip()
