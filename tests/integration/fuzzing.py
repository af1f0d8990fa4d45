"""Hypothesis strategies for the fuzz tests: any hetero.v1 message, and job specs.

``messages(descriptor)`` builds a message of that type with every field
unset or drawn from its whole range (NaN and infinities for floats, int64
extremes, unknown enum numbers, odd unicode), strings sometimes taken from
``pools`` (ids that exist in the database, so calls get past "not found").

``job_specs()`` is YAML text: a valid spec with keys deleted, replaced by
values of any type or added, then sometimes cut or spliced at the character
level, plus hand-written nasties (tags, anchors, deep nesting, NUL bytes).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import yaml
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}
NASTY_STRINGS = (
    "",
    " ",
    "../../../../etc/passwd",
    "/etc/hetero/token",
    "x" * 300,
    "a\x00b",
    "line\nbreak",
    "é🚀\u202e",
    "'; DROP TABLE jobs; --",
    "%s%n",
    "JOB_STATE_RUNNING",
)
_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)


def _ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    small = st.integers(max(lo, -3), min(hi, 70))
    return st.one_of(small, st.sampled_from([lo, hi, 0, -1 if lo < 0 else 1]), st.integers(lo, hi))


def _scalar(f: FieldDescriptor, pools: dict[str, Sequence[str]], depth: int) -> Any:
    t = f.type
    if t in INT_RANGES:
        return _ints(*INT_RANGES[t])
    if t == FieldDescriptor.TYPE_DOUBLE:
        return st.one_of(st.floats(), st.sampled_from([0.0, -0.0, math.nan, math.inf, -math.inf]))
    if t == FieldDescriptor.TYPE_FLOAT:
        return st.floats(width=32)
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == FieldDescriptor.TYPE_ENUM:
        return st.integers(-2, len(f.enum_type.values) + 2)
    if t == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if t == FieldDescriptor.TYPE_STRING:
        pool = pools.get(f.name) or pools.get("*") or ()
        options = [_text, st.sampled_from(NASTY_STRINGS)]
        if pool:
            options = [st.sampled_from(list(pool)), st.sampled_from(list(pool)), *options]
        return st.one_of(*options)
    if t == FieldDescriptor.TYPE_MESSAGE:
        return messages(f.message_type, pools, depth + 1)
    raise AssertionError(f"unhandled field type {t} of {f.full_name}")


def _repeated(f: FieldDescriptor) -> bool:
    if hasattr(f, "is_repeated"):  # protobuf >= 6 (``label`` is gone)
        return bool(f.is_repeated)
    return bool(f.label == FieldDescriptor.LABEL_REPEATED)


def messages(
    desc: Descriptor, pools: dict[str, Sequence[str]] | None = None, depth: int = 0
) -> st.SearchStrategy[Message]:
    """Messages of type ``desc``; ``pools[field name]`` (or ``pools["*"]``) feeds strings."""
    pools = pools or {}
    cls = message_factory.GetMessageClass(desc)
    if depth > 3:
        return st.just(cls())
    optional: dict[str, Any] = {}
    for f in desc.fields:
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            key_f, value_f = (
                f.message_type.fields_by_name["key"],
                f.message_type.fields_by_name["value"],
            )
            optional[f.name] = st.dictionaries(
                _scalar(key_f, pools, depth), _scalar(value_f, pools, depth), max_size=3
            )
        elif _repeated(f):
            optional[f.name] = st.lists(_scalar(f, pools, depth), max_size=5)
        else:
            optional[f.name] = _scalar(f, pools, depth)
    return st.fixed_dictionaries({}, optional=optional).map(lambda kw: cls(**kw))


# ---- job specs ------------------------------------------------------------------------------

VALID_SPEC: dict[str, Any] = {
    "name": "fuzz",
    "model": "debug",
    "global_batch": 16,
    "steps": 20,
    "policy": "dynamic",
    "rebalance_interval": 5,
    "resources": {"ranks": 1, "device": "cpu"},
}
TOP_KEYS = (
    "name",
    "model",
    "dataset",
    "data_dir",
    "command",
    "global_batch",
    "min_batch",
    "steps",
    "epochs",
    "policy",
    "rebalance_interval",
    "checkpoint",
    "max_restarts",
    "emulate_slowdown",
    "lr",
    "seed",
    "resources",
    "unknown_key",
)
NESTED_KEYS = {
    "resources": ("ranks", "nodes", "allow_cpu", "device", "gpus"),
    "checkpoint": ("dir", "interval_steps", "every"),
}
_leaf = st.one_of(
    st.none(),
    st.booleans(),
    _ints(-(2**70), 2**70),
    st.floats(),
    _text,
    st.sampled_from(
        [
            "/tmp/fuzz",
            "relative/dir",
            "/etc/cron.d",
            "dynamic",
            "equal",
            "debug",
            "resnet50",
            "cpu",
            "cuda",
            "imagefolder",
            "synthetic",
            "python -c 'print(1)'",
            "a\x00b",
        ]
    ),
)
_values = st.recursive(
    _leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(_text, _ints(-2, 9)), inner, max_size=3),
    ),
    max_leaves=8,
)


@st.composite
def _structured(draw: st.DrawFn) -> str:
    spec = copy.deepcopy(VALID_SPEC)
    for _ in range(draw(st.integers(0, 4))):
        key = draw(st.sampled_from(TOP_KEYS))
        action = draw(st.sampled_from(("set", "delete", "nested")))
        if action == "delete":
            spec.pop(key, None)
        elif action == "nested" and key in NESTED_KEYS:
            inner = spec.get(key) if isinstance(spec.get(key), dict) else {}
            inner = dict(inner)
            inner[draw(st.sampled_from(NESTED_KEYS[key]))] = draw(_values)
            spec[key] = inner
        else:
            spec[key] = draw(_values)
    return yaml.safe_dump(spec, allow_unicode=True)


@st.composite
def _spliced(draw: st.DrawFn) -> str:
    text = draw(_structured())
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 8)))
        text = text[:i] + draw(st.text(max_size=6)) + text[j:]
    return text


NASTY_SPECS = (
    "",
    "---\n...\n",
    "[1, 2, 3]\n",
    "name: a\nname: b\n",
    "a: &x [*x]\n",
    "name: !!python/object/apply:os.system ['true']\n",
    "name: !!binary aGVsbG8=\nmodel: debug\nglobal_batch: 8\nsteps: 1\nresources: {ranks: 1}\n",
    "x: " + "[" * 3000 + "]" * 3000 + "\n",
    "a: &a ['lol','lol']\nb: &b [*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b]\nd: [*c,*c,*c,*c]\n",
    "name: fuzz\nmodel: debug\nglobal_batch: 8\nsteps: 1\nresources: {ranks: 1}\nseed: "
    + "9" * 5000
    + "\n",
    "\ufeffname: bom\n",
    "name: x\x00\n",
    "? [complex, key]\n: value\n",
    "name: fuzz\nmodel: debug\nglobal_batch: 8\nsteps: 2020-01-01\nresources: {ranks: 1}\n",
)


def job_specs() -> st.SearchStrategy[str]:
    """YAML text near a valid job spec, and far from it."""
    return st.one_of(
        _structured(),
        _structured(),
        _spliced(),
        st.sampled_from(NASTY_SPECS),
        st.text(max_size=200),
    )
