"""What one training option is: its name, kind, default, help, and where it can be given.

An option is declared once, as a field of ``TrainingOptions``
(``hetero.core.catalogue.training``) through :func:`opt`; everything else —
``hetero-train``'s flags, job.yaml's keys, the Python keywords, the docs'
tables — is read off these descriptions. The spelling differs by entry point
(``--global-batch``, ``global_batch``, ``global_batch=``) and so does the
message of an error: :class:`OptionError` carries the option's name and each
entry point writes it its own way.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from dataclasses import dataclass
from typing import Any, TypeVar

from hetero.core.catalogue.kinds import Invalid, Kind
from hetero.core.errors import ConfigError

T = TypeVar("T")


class Entry(enum.Enum):
    """The ways in. ``value`` is how the docs name them."""

    CLI = "hetero-train"
    YAML = "job.yaml"
    API = "Python"


ALL = frozenset(Entry)

#: Field metadata key holding an option's description.
_META = "hetero.option"


@dataclass(frozen=True)
class Option:
    """One training option.

    ``where``: the entry points that take it; ``absent`` says why any other one
    does not (required whenever ``where`` is not all three). ``default_doc``
    states the default in words when it is decided at run time (``None`` in
    the field: "the model's", "100 without epochs"). ``yaml_key`` is job.yaml's
    key when it is not the name (``checkpoint.dir``); ``aliases`` are further
    command-line spellings, from the origin documents. ``init``: also a keyword
    of ``ht.init``, the options a user's own training loop has. ``yaml_note``,
    ``yaml_type`` and ``yaml_default`` say what differs for a reader of job.yaml. ``help`` may
    mention other options through :func:`ref`; :meth:`help_for` spells them.
    """

    name: str
    kind: Kind
    default: Any
    help: str
    group: str
    where: frozenset[Entry] = ALL
    absent: str = ""
    default_doc: str | None = None
    yaml_key: str | None = None
    aliases: tuple[str, ...] = ()
    init: bool = False
    yaml_note: str = ""
    yaml_type: str | None = None
    yaml_default: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def key(self) -> str:
        return self.yaml_key or self.name

    def spelled(self, entry: Entry) -> str:
        """The option as a user of ``entry`` writes it."""
        if entry is Entry.CLI:
            return self.flag
        return self.key if entry is Entry.YAML else self.name

    def help_for(self, entry: Entry) -> str:
        """The help text, other options mentioned as ``entry`` spells them."""
        text = self.help + (f"; {self.yaml_note}" if entry is Entry.YAML and self.yaml_note else "")
        return respell(text, entry)

    def check(self, value: object) -> Any:
        """``value`` (Python) as the canonical value; ``None`` keeps an unset option unset."""
        if value is None and self.default is None:
            return None
        try:
            return self.kind.check(value)
        except Invalid as exc:
            raise OptionError(self.name, str(exc)) from None

    def from_text(self, text: str) -> Any:
        try:
            return self.kind.from_text(text)
        except Invalid as exc:
            raise OptionError(self.name, str(exc)) from None

    def to_text(self, value: object) -> str:
        return self.kind.to_text(value)

    def default_words(self, entry: Entry = Entry.API) -> str:
        """The default as the docs and ``--help`` show it."""
        if self.default_doc is not None:
            return respell(self.default_doc, entry)
        if self.default is None:
            return "none"
        return self.kind.to_text(self.default)


def opt(default: T, kind: Kind, help: str, group: str, **more: Any) -> T:
    """A ``TrainingOptions`` field carrying its :class:`Option` description (name added later)."""
    spec = {"kind": kind, "help": help, "group": group, **more}
    return dataclasses.field(default=default, metadata={_META: spec})


def described(cls: type) -> tuple[Option, ...]:
    """The options of a dataclass whose fields were declared with :func:`opt`, in order."""
    return tuple(
        Option(name=f.name, default=f.default, **f.metadata[_META])
        for f in dataclasses.fields(cls)
        if _META in f.metadata
    )


# ---- errors that name an option in the caller's spelling ---------------------------------

_REF = re.compile(r"\x00(\w+)\x00")


def ref(name: str) -> str:
    """A mention of option ``name`` inside an :class:`OptionError` message; each entry point
    writes it in its own spelling (``--steps``, ``steps``)."""
    return f"\x00{name}\x00"


def respell(text: str, entry: Entry) -> str:
    """``text`` with every :func:`ref` written as ``entry`` spells the option."""
    from hetero.core.catalogue.training import BY_NAME

    return _REF.sub(lambda m: BY_NAME[m.group(1)].spelled(entry), text)


class OptionError(ConfigError):
    """A bad value of option ``option``. ``str()`` uses the Python spelling; an entry point
    rewrites it with :meth:`spelled`. ``anchor`` is the option whose place in a job file
    the error belongs to when ``option`` itself is missing from it."""

    def __init__(self, option: str, detail: str, anchor: str | None = None) -> None:
        self.option = option
        self.detail = detail
        self.anchor = anchor
        plain = _REF.sub(lambda m: m.group(1), detail)
        super().__init__(f"{option}: {plain}")

    def detail_for(self, spell: Any) -> str:
        """The message without the option's name, mentions written by ``spell(name)``."""
        return _REF.sub(lambda m: str(spell(m.group(1))), self.detail)

    def spelled(self, spell: Any) -> ConfigError:
        """The error as a ``ConfigError`` whose message names options with ``spell(name)``."""
        return ConfigError(f"{spell(self.option)}: {self.detail_for(spell)}")
