"""JSON as it crosses a boundary (a worker's events, a server payload, a CLI's --json output), named once for every
floor: a parameter says it holds parsed JSON instead of saying nothing with Any."""

from __future__ import annotations

from typing import TypeAlias

#: One parsed JSON value.
JsonValue: TypeAlias = "str | int | float | bool | list[JsonValue] | dict[str, JsonValue] | None"
#: A parsed JSON object.
JsonDict: TypeAlias = "dict[str, JsonValue]"
