"""Typed reads from a YAML mapping that remember where every value came from.

Job specs and daemon configs are parsed once at the edge. Every error this
module raises is a ``ConfigError`` naming the source, the line and the field
(``job.yaml:7: resources.ranks: must be >= 1, got 0``), and a key nobody read
is an error with a "did you mean" hint, so a typo never silently falls back to
a default.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from hetero.core.errors import ConfigError

#: Longest daemon config file read, in bytes.
MAX_CONFIG_BYTES = 1024 * 1024


def read_text(path: str | Path, what: str, limit_bytes: int) -> str:
    """The UTF-8 text of ``path``, at most ``limit_bytes`` long.

    Reads at most ``limit_bytes + 1`` bytes, so ``/dev/zero`` or a huge file costs
    no more memory than the limit; too long, unreadable or not UTF-8 is a
    one-line ``ConfigError`` naming ``what`` and the path."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit_bytes + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if len(data) > limit_bytes:
        raise ConfigError(f"{path}: {what} is longer than the limit of {limit_bytes:,} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"{path}:{line}: {what} is not UTF-8 text (byte {exc.start}: 0x{data[exc.start]:02x})"
        ) from None


#: libyaml's parser where PyYAML was built with it (its wheels are): the same nodes and
#: marks, composed several times faster than by the pure-Python one, which the
#: coordinator notices when it loads thousands of queued jobs' specs at start.
_SafeLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class Loader(_SafeLoader):  # type: ignore[valid-type, misc]
    """PyYAML's safe loader, reading floats as YAML 1.2 does.

    PyYAML resolves YAML 1.1, whose floats need a dot (``1.0e-3``): ``lr: 1e-3``
    would be the *string* "1e-3" and fail as "must be a number". Every float a
    user writes the way Python and YAML 1.2 do (``1e-3``, ``5E+2``) is a float here.
    """


# YAML 1.1's float pattern plus exponents without a dot; the int resolver runs first,
# so plain integers stay ints.
Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def _line(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1


class Fields:
    """The keys of one YAML mapping node, read once each through typed getters."""

    def __init__(self, node: yaml.Node, source: str, prefix: str = "") -> None:
        self.source = source
        self.prefix = prefix
        self.node = node
        if not isinstance(node, yaml.MappingNode):
            where = prefix.rstrip(".") or "the document"
            raise self.error(node, f"{where} must be a mapping of keys to values")
        self._items: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise self.error(key_node, "keys must be plain names")
            key = str(key_node.value)
            if key in self._items:
                first = _line(self._items[key][0])
                raise self.error(key_node, f"{prefix}{key}: duplicate key (first on line {first})")
            self._items[key] = (key_node, value_node)
        self._read: set[str] = set()
        # Every key a getter asked for, present or not: the vocabulary for hints.
        self._asked: set[str] = set()

    @classmethod
    def parse(cls, text: str, source: str) -> Fields:
        """Compose ``text`` (no object construction yet) and wrap its top mapping."""
        try:
            node = yaml.compose(text, Loader=Loader)
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line = f":{mark.line + 1}" if mark is not None else ""
            raise ConfigError(_cap(f"{source}{line}: not valid YAML: {exc.problem}")) from None
        except yaml.YAMLError as exc:
            raise ConfigError(_cap(f"{source}: not valid YAML: {exc}")) from None
        except RecursionError:
            raise ConfigError(f"{source}: not valid YAML: nested too deeply") from None
        if node is None:
            raise ConfigError(f"{source}: empty document")
        return cls(node, source)

    @classmethod
    def read_config(cls, path: Path | None, default: Path) -> Fields | None:
        """A daemon's config file: ``path``, else ``default`` if it exists, else None."""
        if path is None:
            if not default.is_file():
                return None
            path = default
        return cls.parse(read_text(path, "config file", MAX_CONFIG_BYTES), str(path))

    def error(self, node: yaml.Node, message: str) -> ConfigError:
        return ConfigError(_cap(f"{self.source}:{_line(node)}: {message}"))

    def line_of(self, key: str) -> int:
        """Line of ``key`` in the source, or of the mapping itself if absent."""
        if key in self._items:
            return _line(self._items[key][0])
        return _line(self.node)

    def fail(self, key: str, message: str, node: yaml.Node | None = None) -> ConfigError:
        """A ``ConfigError`` for field ``key``, at ``node``'s line or else the key's."""
        line = _line(node) if node is not None else self.line_of(key)
        return ConfigError(_cap(f"{self.source}:{line}: {self.prefix}{key}: {message}"))

    def fail_near(self, anchor: str, key: str, message: str) -> ConfigError:
        """A ``ConfigError`` for a missing ``key`` that ``anchor``'s value makes necessary."""
        return ConfigError(f"{self.source}:{self.line_of(anchor)}: {self.prefix}{key}: {message}")

    def names(self) -> tuple[str, ...]:
        """Every key of the mapping, in file order (for mappings whose keys are data)."""
        return tuple(self._items)

    def has(self, key: str) -> bool:
        self._asked.add(key)
        return key in self._items

    def _present(self, key: str) -> bool:
        self._asked.add(key)
        return key in self._items

    def _scalar(self, key: str) -> tuple[yaml.Node, Any]:
        self._read.add(key)
        _, node = self._items[key]
        if not isinstance(node, yaml.ScalarNode):
            raise self.fail(key, "must be a single value, not a list or mapping")
        return node, self._construct(key, node)

    def _construct(self, key: str, node: yaml.Node) -> Any:
        """The Python value of a scalar; a tag it cannot carry (``!!int abc``, ``!foo``)
        is an error naming ``key``, not an exception from deep inside PyYAML."""
        try:
            return Loader("").construct_object(node)
        except (yaml.YAMLError, ValueError, TypeError, OverflowError, RecursionError):
            raise self.fail(key, f"cannot read the value tagged {node.tag}", node) from None

    def scalar(self, key: str) -> Any:
        """The plain Python value under ``key`` (a single value, not a list or mapping)."""
        self._asked.add(key)
        return self._scalar(key)[1]

    def string(self, key: str, default: str | None = None) -> str | None:
        if not self._present(key):
            return default
        _, value = self._scalar(key)
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, f"must be a non-empty string, got {_short(value)}")
        return value

    def path(self, key: str) -> Path | None:
        """A file or directory name (``~`` expanded), or None if absent."""
        value = self.string(key)
        return Path(value).expanduser() if value is not None else None

    def strings(self, key: str) -> tuple[str, ...] | None:
        """A list of non-empty strings, or None if absent."""
        node = self.raw(key)
        if node is None:
            return None
        values = (
            [self.value_of(n) if isinstance(n, yaml.ScalarNode) else None for n in node.value]
            if isinstance(node, yaml.SequenceNode)
            else [None]
        )
        if any(not isinstance(v, str) or not v.strip() for v in values):
            raise self.fail(key, "must be a list of strings")
        return tuple(str(v) for v in values)

    def choice(self, key: str, choices: Sequence[str], default: str | None = None) -> str | None:
        value = self.string(key, default)
        if value is not None and value not in choices:
            hint = _did_you_mean(value, choices)
            raise self.fail(
                key, f"unknown value {_short(value)}{hint} (known: {', '.join(choices)})"
            )
        return value

    def integer(
        self,
        key: str,
        default: int | None = None,
        *,
        minimum: int | None = None,
        maximum: int | None = None,
    ) -> int | None:
        if not self._present(key):
            return default
        _, value = self._scalar(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"must be a whole number, got {_short(value)}")
        if minimum is not None and value < minimum:
            raise self.fail(key, f"must be >= {minimum}, got {_short(value)}")
        if maximum is not None and value > maximum:
            raise self.fail(key, f"must be <= {maximum:,}, got {_short(value)}")
        return value

    def number(
        self,
        key: str,
        default: float | None = None,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
        positive: bool = False,
    ) -> float | None:
        if not self._present(key):
            return default
        _, value = self._scalar(key)
        out = self.check_number(key, value, minimum=minimum, positive=positive)
        if maximum is not None and out > maximum:
            raise self.fail(key, f"must be <= {maximum:g}, got {_short(value)}")
        return out

    def check_number(
        self,
        key: str,
        value: object,
        *,
        minimum: float | None = None,
        positive: bool = False,
        node: yaml.Node | None = None,
    ) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(key, f"must be a number, got {_short(value)}", node)
        try:
            out = float(value)
        except OverflowError:
            out = math.inf
        if not math.isfinite(out):
            raise self.fail(key, f"must be finite, got {_short(value)}", node)
        if positive and out <= 0:
            raise self.fail(key, f"must be > 0, got {_short(value)}", node)
        if minimum is not None and out < minimum:
            raise self.fail(key, f"must be >= {minimum:g}, got {_short(value)}", node)
        return out

    def boolean(self, key: str, default: bool) -> bool:
        if not self._present(key):
            return default
        _, value = self._scalar(key)
        if not isinstance(value, bool):
            raise self.fail(key, f"must be true or false, got {_short(value)}")
        return value

    def mapping(self, key: str) -> Fields | None:
        """The nested mapping under ``key`` (its own unknown keys checked by ``finish``)."""
        if not self._present(key):
            return None
        self._read.add(key)
        return Fields(self._items[key][1], self.source, f"{self.prefix}{key}.")

    def raw(self, key: str) -> yaml.Node | None:
        """The node under ``key`` for callers that accept several shapes."""
        if not self._present(key):
            return None
        self._read.add(key)
        return self._items[key][1]

    def value_of(self, node: yaml.Node, key: str = "value") -> Any:
        """The plain Python value of a scalar node (``key`` names it in errors)."""
        return self._construct(key, node)

    def finish(self) -> None:
        """Raise for the first key no getter read: a typo must not become a silent default."""
        known = sorted(self._asked)
        for key, (key_node, _) in self._items.items():
            if key not in self._read:
                hint = _did_you_mean(key, known)
                raise self.error(key_node, f"{self.prefix}{key}: unknown field{hint}")


#: Longest error message, in characters: a key or value from a hostile file must not
#: make a page-long message (or one too big for a gRPC status).
MAX_MESSAGE_CHARS = 500


def _cap(message: str) -> str:
    one_line = " ".join(message.split("\n"))
    return (
        one_line
        if len(one_line) <= MAX_MESSAGE_CHARS
        else one_line[: MAX_MESSAGE_CHARS - 3] + "..."
    )


def _short(value: object, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters: an error names the value, not a page of it."""
    try:
        text = repr(value)
    except ValueError:  # an int too long for repr (Python's 4300-digit limit)
        text = "a number too large to show"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _did_you_mean(word: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
