"""dataclasses.asdict without its cost: a config's identity is hashed from its dict for every
grid point (a 10,000-point grid builds 10,000), and asdict deep-copies each leaf on the way."""

from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Any

_fields = functools.cache(dataclasses.fields)
_IMMUTABLE = (str, int, float, bool, type(None))


def plain(value: Any) -> Any:
    """What dataclasses.asdict(value) returns for a dataclass (and its conversion of any other
    value): dataclasses as dicts in field order, lists, tuples and dicts rebuilt, other leaves
    deep-copied; immutable leaves are returned as they are, which a deep copy would do too."""
    if isinstance(value, _IMMUTABLE):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in _fields(type(value))}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple, as asdict rebuilds it
        return type(value)(*(plain(v) for v in value))
    if isinstance(value, list | tuple):
        return type(value)(plain(v) for v in value)
    if isinstance(value, dict):
        return type(value)((plain(k), plain(v)) for k, v in value.items())
    return copy.deepcopy(value)
