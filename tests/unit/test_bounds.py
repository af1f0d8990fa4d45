"""Every field of every request the coordinator serves is bounded, or said to be free
(``coordinator.bounds``): a field added to the protocol cannot slip through unchecked."""

from __future__ import annotations

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from hetero.coordinator import bounds
from hetero.v1 import coordinator_pb2 as pb

_UNCHECKED = (FieldDescriptor.TYPE_BOOL, FieldDescriptor.TYPE_ENUM, FieldDescriptor.TYPE_MESSAGE)


def _fields(d: Descriptor, seen: set[str]) -> set[str]:
    """``Message.field`` of every number and string field reachable from ``d``."""
    if d.full_name in seen:
        return set()
    seen.add(d.full_name)
    out: set[str] = set()
    for f in d.fields:
        if f.type == FieldDescriptor.TYPE_MESSAGE:
            out |= _fields(f.message_type, seen)
        elif f.type not in _UNCHECKED:
            out.add(f"{d.name}.{f.name}")
    return out


def test_every_number_and_string_of_every_request_is_bounded_or_said_free() -> None:
    seen: set[str] = set()
    service = pb.DESCRIPTOR.services_by_name["Coordinator"]
    fields: set[str] = set()
    for method in service.methods:
        fields |= _fields(method.input_type, seen)
    tables = (bounds.NUMBERS, bounds.NAMES, bounds.FREE)
    covered = set().union(*tables)
    assert fields - covered == set(), "fields with no bound: add them to bounds"
    assert covered - fields == set(), "bounds of fields no request has"
    assert sum(len(t) for t in tables) == len(covered), "a field in two tables"
