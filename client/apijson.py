"""The JSON of ``hetero-coord ... --json``: the API's messages as a script reads them.

It is protobuf's JSON mapping (field names as in ``proto/hetero/v1/*.proto``), with
three differences that make it easy to use from ``jq`` or Python without the schema:

- every field is present: a field at its default prints its default (rank 0 has
  ``"rank": 0``, an empty list is ``[]``), and a field the API leaves unset (an
  ``optional`` one, or a message: ``exit_code`` of a running rank, ``live`` before the
  first report) is ``null``;
- an enum value is its name without the enum's prefix, as ``core.states`` and the
  database name it: ``"SUCCEEDED"``, ``"EXITED"``, ``"CPU"`` (a number the client
  does not know stays a number);
- a 64-bit integer is a JSON number, not a string (``"seq": 17``, ``"last_step": 70``).

Bytes are base64 and a non-finite float is ``"NaN"``, ``"Infinity"`` or
``"-Infinity"``, as in protobuf's mapping; JSON has no value for either.
"""

from __future__ import annotations

import base64
import math
import re
from typing import Any

from google.protobuf.descriptor import EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message


def api_dict(message: Message) -> dict[str, Any]:
    """``message`` as the module doc describes it: every field, by its proto name."""
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if _is_map(field):
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {str(k): _value(value_field, v) for k, v in value.items()}
        elif field.is_repeated:
            out[field.name] = [_value(field, v) for v in value]
        elif field.has_presence and not message.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = _value(field, value)
    return out


def enum_short_name(enum: EnumDescriptor, number: int) -> str | int:
    """``JOB_STATE_SUCCEEDED`` of ``JobState`` -> ``"SUCCEEDED"``; an unknown number
    stays the number (a newer coordinator's state reaches an older client so)."""
    value = enum.values_by_number.get(number)
    if value is None:
        return number
    prefix = re.sub(r"(?<!^)(?=[A-Z])", "_", enum.name).upper() + "_"
    return str(value.name).removeprefix(prefix)


def _is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _value(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return api_dict(value)
    if field.type == FieldDescriptor.TYPE_ENUM:
        return enum_short_name(field.enum_type, value)
    if field.type == FieldDescriptor.TYPE_BYTES:
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value
