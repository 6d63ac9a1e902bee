"""Build frozen config dataclasses from plain mappings (YAML, or a protobuf Struct turned into a dict).

A typo must not silently become a new key, and a Struct carries every number as a double, so ``64.0`` has to
become the int 64 while ``64.5`` for an int field is an error. Errors name the full field path.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")

NULL_SECTION = "expected a mapping, got null (an empty section: remove the key to use the defaults)"
"""The error for a null where a section is expected: YAML reads a section whose keys are all commented out as null,
and taking that for "all defaults" silently replaced the embedded default config's section with the bare
dataclass defaults (another network, another learning rate)."""


def from_mapping(cls: type[T], mapping: Mapping[str, Any] | None, path: str = "") -> T:
    """An instance of dataclass ``cls`` from ``mapping``; missing fields take their defaults, and so does a
    whole ``mapping`` of None (a job without the section). A nested section given as null is refused."""
    if mapping is None:
        mapping = {}
    if isinstance(mapping, cls):
        return mapping
    if not isinstance(mapping, Mapping):
        raise ValueError(f"{path or cls.__name__}: expected a mapping, got {type(mapping).__name__}")
    hints, fields = _fields(cls)
    unknown = sorted(set(mapping) - set(fields))
    if unknown:
        raise ValueError(f"{path or cls.__name__}: unknown field(s) {unknown}; known: {sorted(fields)}")
    kwargs = {name: _convert(hints[name], value, _join(path, name)) for name, value in mapping.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:  # a required field without default, or the class's own checks
        raise ValueError(f"{path or cls.__name__}: {e}") from e


@functools.cache
def _fields(cls: type) -> tuple[dict[str, Any], frozenset[str]]:
    """Resolved field types (resolving annotations is slow: once per class)."""
    return typing.get_type_hints(cls), frozenset(f.name for f in dataclasses.fields(cls) if f.init)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _convert(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, path)
            except ValueError as e:
                errors.append(str(e))
        raise ValueError("; ".join(errors))
    if origin is typing.Literal:
        if value not in args:
            raise ValueError(f"{path}: expected one of {list(args)}, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        if value is None:
            raise ValueError(f"{path}: {NULL_SECTION}")
        return from_mapping(tp, value, path)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ValueError(f"{path}: expected a list, got {type(value).__name__}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise ValueError(f"{path}: expected {len(args)} items, got {len(value)}")
        return tuple(_convert(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True)))
    if tp is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{path}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{path}: expected an integer, got {value!r}")
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(f"{path}: expected an integer, got {value!r}")
        return int(value)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{path}: expected a number, got {value!r}")
        if not math.isfinite(value):  # NaN passes every `x <= 0` check and a Struct cannot carry it
            raise ValueError(f"{path}: expected a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ValueError(f"{path}: expected a string, got {value!r}")
        return value
    raise TypeError(f"{path}: unsupported config field type {tp!r}")
