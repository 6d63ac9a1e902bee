"""Typed configuration: YAML in, frozen dataclasses out, and every mistake named by its key path.

Why not an attribute dict: a typo there silently becomes a new key. Here an unknown key, a wrong type or a
missing required value raises `ConfigError` with the path of the offending key, e.g.
`league.main_player.one_phase_step: expected int, got str ('1e6')`.

The machinery is generic; each service declares its own schema as dataclasses and calls `from_dict`.
Supported field types: bool, int, float, str, Any, enums, Literal[...], `X | None`, nested dataclasses,
`dict` (free, JSON-like), `dict[str, X]`, `list[X]`, `tuple[X, ...]`.

Merging defaults with a user's file is type-aware (`merge_with_defaults`): sections that are dataclasses and
free dicts merge key by key; a field marked with `REPLACE` metadata (e.g. branch probabilities that must sum
to one) is replaced as a whole, so a user's value never mixes with the default's keys.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import math
import re
import types
import typing
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

import yaml

from common.typed_config import NULL_SECTION

T = TypeVar("T")

# Field metadata: a user's value for this field replaces the default wholesale instead of merging into it.
REPLACE: Mapping[str, str] = types.MappingProxyType({"merge": "replace"})


class ConfigError(ValueError):
    """A configuration value that is missing, unknown or of the wrong type; `path` names the key."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message


def join_path(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """A new dict: `override` merged into `base` key by key, recursing where both sides are mappings.

    Neither input is modified; values are deep-copied so the result shares nothing with them.
    """
    merged: dict[str, Any] = {k: copy.deepcopy(v) for k, v in base.items()}
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def merge_with_defaults(
    cls: type, defaults: Mapping[str, Any], override: Mapping[str, Any]
) -> dict[str, Any]:
    """Merge `override` into `defaults` following the schema `cls`: REPLACE fields are taken whole.

    Keys the schema does not know are carried over untouched so that `from_dict` reports them with their path;
    so is a null (an empty section), which the parse refuses where a section belongs, naming the key: here a
    free section such as `policy` has no schema to tell a section from a setting whose null means something.
    """
    if not dataclasses.is_dataclass(cls):
        return deep_merge(defaults, override)
    hints = typing.get_type_hints(cls)
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    merged: dict[str, Any] = {k: copy.deepcopy(v) for k, v in defaults.items()}
    for key, value in override.items():
        field = by_name.get(key)
        current = merged.get(key)
        if field is None or field.metadata.get("merge") == "replace":
            merged[key] = copy.deepcopy(value)
        elif isinstance(value, Mapping) and isinstance(current, Mapping):
            section = _dataclass_in(hints[key])
            merged[key] = (
                merge_with_defaults(section, current, value) if section else deep_merge(current, value)
            )
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML file whose top level is a mapping (an empty file reads as {})."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:  # a missing file, a directory, no permission: the CLIs report it like any config error
        raise ConfigError("", f"{path}: cannot read the config file: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError("", f"{path}: not a text file (UTF-8): {exc}") from exc
    return parse_yaml(text, source=str(path))


MAX_DURATION_S = 1e7
"""The longest time any setting or flag takes, in seconds (about 116 days, far above any useful lease, timeout or
backoff). Python's waits and sleeps refuse more than threading.TIMEOUT_MAX (9.2e9 s): past it a heartbeat
thread died on its first wait, and `--drain 1e10` ended the coordinator's stop in an OverflowError."""

MAX_CONFIG_VALUES = 100_000
"""The most values a config file may hold once YAML aliases are expanded (the default league has a few
hundred). Aliases and merges (`&defaults`, `<<: *defaults`) are fine; a chain of them (a "billion laughs":
nine levels of nine aliases are 3.4 billion values) hung the CLI with growing memory when the config was walked."""


_MERGE_TAG = "tag:yaml.org,2002:merge"


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (two `env:` sections, say, silently kept the last
    one), and merges (`<<: *defaults`, `<<: [*a, *b]`) as the YAML spec says: a mapping's own keys win over merged
    ones, and of several merged mappings the earlier wins. PyYAML 6.0.4's own merging (yaml/pyyaml#953) let which
    value won depend on the key's length in chains and lists of merges: `lr` from the wrong mapping, silently (a
    review)."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._flattened: set[int] = set()

    def flatten_mapping(self, node: Any) -> None:
        """Put the merged mappings' pairs before the node's own, the earlier mapping's last (dict construction
        keeps the last of equal keys); each node once: a mapping merged in several places is an alias of one
        node, flattened at its first use (checking it for duplicates then, before merged keys join it)."""
        if id(node) in self._flattened:
            return
        self._flattened.add(id(node))
        merged: list[Any] = []
        own: list[Any] = []
        seen: set[Any] = set()
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                for source in sources:
                    if not isinstance(source, yaml.MappingNode):
                        raise yaml.constructor.ConstructorError(
                            "while constructing a mapping", node.start_mark,
                            f"expected a mapping or a list of mappings to merge, but found {source.id}",
                            source.start_mark)
                    self.flatten_mapping(source)
                for source in reversed(sources):
                    merged.extend(source.value)
                continue
            if key_node.tag == "tag:yaml.org,2002:value":  # (as SafeLoader: `=` as a key is the string "=")
                key_node.tag = "tag:yaml.org,2002:str"
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, Hashable):
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        "while reading a mapping", node.start_mark, f"found the key {key!r} a second time",
                        key_node.start_mark)
                seen.add(key)
            own.append((key_node, value_node))
        node.value = merged + own


# YAML 1.1 (PyYAML's) reads `010` as the octal 8 and `1:30` as the base-60 90 (`unroll_len: 010` loaded as 8,
# `one_phase_step: 012000` as 5120, `seconds: 1:30` as 90): YAML 1.2 has neither, and nobody means them in a
# config. They are refused, naming how to write the number.
_LEADING_ZERO_INT = re.compile(r"^[-+]?0[0-9_]+$")


def _construct_int(loader: yaml.SafeLoader, node: Any) -> Any:
    text = loader.construct_scalar(node)
    if isinstance(text, str) and (":" in text or _LEADING_ZERO_INT.match(text)):
        what = "a base-60 number (YAML 1.1)" if ":" in text else "an octal number with a leading zero (YAML 1.1)"
        raise yaml.constructor.ConstructorError(
            None, None, f"{text!r} would be read as {what}: write the number plainly (or quote it for a string)",
            node.start_mark)
    return yaml.SafeLoader.construct_yaml_int(loader, node)


def _construct_float(loader: yaml.SafeLoader, node: Any) -> Any:
    text = loader.construct_scalar(node)
    if isinstance(text, str) and ":" in text:
        raise yaml.constructor.ConstructorError(
            None, None, f"{text!r} would be read as a base-60 number (YAML 1.1): write the number plainly (or quote "
            "it for a string)", node.start_mark)
    return yaml.SafeLoader.construct_yaml_float(loader, node)


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_StrictLoader.add_constructor("tag:yaml.org,2002:float", _construct_float)


# YAML 1.1 (PyYAML's) reads a number in exponent form as a float only with a dot in the mantissa and a sign in
# the exponent (`1.0e-3`): `learning_rate: 1e-3` was the string '1e-3', refused as "expected a number" (a review;
# an earlier fix only told users how to write it). YAML 1.2 and Python read `1e-3`, `1.5e3` and `1e+3` as
# numbers; so does this loader. Quoted, they stay strings.
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"))


def _count_values(value: Any, counted: dict[int, int], open_: set[int], source: str) -> int:
    """How many values `value` holds with its aliases expanded (each shared part is counted once, then
    multiplied): ConfigError past MAX_CONFIG_VALUES, or when an alias refers to a value it is inside of."""
    if not isinstance(value, dict | list | set):
        return 1
    key = id(value)
    if key in counted:
        return counted[key]
    if key in open_:
        raise ConfigError("", f"{source}: a YAML alias refers to a value it is inside of")
    open_.add(key)
    parts = [*value.keys(), *value.values()] if isinstance(value, dict) else value
    total = 1
    for part in parts:
        total += _count_values(part, counted, open_, source)
        if total > MAX_CONFIG_VALUES:
            raise ConfigError("", f"{source}: holds over {MAX_CONFIG_VALUES:,} values once its YAML aliases are "
                                  "expanded (a chain of aliases?)")
    open_.discard(key)
    counted[key] = total
    return total


def parse_yaml(text: str, source: str = "<string>") -> dict[str, Any]:
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        for mark in (exc.context_mark, exc.problem_mark):  # named "<unicode string>", the text's stand-in
            if mark is not None:
                mark.name = source
        raise ConfigError("", f"{source}: not valid YAML: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError("", f"{source}: not valid YAML: {exc}") from exc
    except ValueError as exc:  # an integer of more than 4300 digits (Python's int-from-str limit)
        raise ConfigError("", f"{source}: cannot read a value: {exc}") from None
    except RecursionError:
        raise ConfigError("", f"{source}: nested too deeply") from None
    except (KeyError, IndexError, AttributeError, TypeError, OverflowError) as exc:
        # SafeLoader's constructors assume a tagged scalar is well formed: `!!bool maybe`, `!!int ""` or
        # `!!timestamp soon` fail inside them with a bare KeyError/IndexError/AttributeError and no position.
        raise ConfigError("", f"{source}: a value's explicit YAML tag (!!bool, !!int, !!float, !!timestamp, "
                              f"!!set ...) does not fit the value: {type(exc).__name__}: {exc}") from None
    try:
        _count_values(data, {}, set(), source)
    except RecursionError:
        raise ConfigError("", f"{source}: nested too deeply") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError("", f"{source}: the top level must be a mapping, got {type(data).__name__}")
    return dict(data)


def from_dict(cls: type[T], data: Any, path: str = "") -> T:
    """Build the dataclass `cls` from a mapping, checking every key and type; errors name the key path."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    if data is None:
        raise ConfigError(path, NULL_SECTION)
    if not isinstance(data, Mapping):
        raise ConfigError(path, f"expected a mapping for {cls.__name__}, got {_type_name(data)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key in data:
        if not isinstance(key, str):
            raise ConfigError(join_path(path, _printable(str(key))), f"keys must be strings, got {_type_name(key)}")
        _check_key(key, path)
        if key not in fields:
            raise ConfigError(
                join_path(path, key), f"unknown key (expected one of: {', '.join(sorted(fields))})"
            )
    kwargs: dict[str, Any] = {}
    for name, field in fields.items():
        if name in data:
            kwargs[name] = _convert(hints[name], data[name], join_path(path, name))
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise ConfigError(join_path(path, name), "missing required key")
    try:
        return cls(**kwargs)
    except ConfigError as exc:  # raised by __post_init__ validation with a path relative to this section
        raise ConfigError(join_path(path, exc.path) if exc.path else path, exc.message) from None


def to_dict(obj: Any) -> Any:
    """A dataclass (or nested values) as plain YAML/JSON-ready data: dicts, lists, scalars."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, Mapping):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_dict(v) for v in obj]
    return copy.deepcopy(obj)


def _dataclass_in(tp: Any) -> type | None:
    """The dataclass in `tp` (itself, or the non-None member of `X | None`), else None."""
    if dataclasses.is_dataclass(tp):
        return tp
    if _is_union(tp):
        members = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(members) == 1 and dataclasses.is_dataclass(members[0]):
            return members[0]
    return None


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _describe(value: Any) -> str:
    if isinstance(value, str | int | float):
        return f"{_type_name(value)} ({repr(value)[:40]})"
    return _type_name(value)


def _expected_name(tp: Any) -> str:
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _convert(tp: Any, value: Any, path: str) -> Any:
    if tp is Any:
        return _plain_data(value, path)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, path)
    origin = typing.get_origin(tp)
    if _is_union(tp):
        return _convert_union(tp, value, path)
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices or isinstance(value, bool) != any(isinstance(c, bool) for c in choices):
            raise ConfigError(path, f"expected one of {', '.join(repr(c) for c in choices)}, got {value!r}")
        return value
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            choices = ", ".join(repr(m.value) for m in tp)
            raise ConfigError(path, f"expected one of {choices}, got {value!r}") from None
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(path, f"expected bool, got {_describe(value)}")
        return value
    if tp is int:
        return _convert_int(value, path)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(path, f"expected float, got {_describe(value)}")
        try:  # (an int beyond a float's range: math.isfinite and float() raise OverflowError, a traceback)
            finite = math.isfinite(value) and math.isfinite(float(value))
        except OverflowError:
            finite = False
        if not finite:
            shown = f"{value!r}" if not isinstance(value, int) else "an integer beyond a float's range"
            raise ConfigError(path, f"expected a finite float, got {shown}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(path, f"expected str, got {_describe(value)}")
        return _check_text(value, path)
    if tp is dict or origin is dict or tp is Mapping or origin is Mapping:
        return _convert_dict(tp, value, path)
    if origin in (list, tuple) or tp in (list, tuple):
        return _convert_sequence(tp, value, path)
    raise TypeError(f"{path}: unsupported config field type {tp!r}")


MAX_FREE_FORM_DEPTH = 20
"""Nested mappings and lists in a free-form value: each is a few messages deep in a protobuf Struct, whose reader
gives up past ~33 (every GetJob reply then failed at the worker as INTERNAL "Exception deserializing response")."""
MAX_EXACT_INT = 2**53
"""Numbers travel in Structs as doubles: an integer beyond this arrives changed (2**53 + 1 as 2**53)."""


def _plain_data(value: Any, path: str, depth: int = 0) -> Any:
    """A free-form value (env kwargs, the policy section, ...) as the plain data it travels as.

    These values reach actors and learners inside protobuf Structs, which hold only string keys, numbers,
    strings, booleans, null, lists and mappings. Integer keys (YAML's `bots: {1: random}`) become the strings
    the wire turns them into anyway, so a local `league eval` and a remote actor see the same kwargs; anything
    else a Struct cannot hold is refused here, naming its key, instead of failing every GetJob later.
    """
    if isinstance(value, float) and not math.isfinite(value):
        # A Struct cannot carry NaN (every job would fail to encode), and no hyperparameter means infinity.
        raise ConfigError(path, f"expected a finite number, got {value!r}")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_EXACT_INT:
        raise ConfigError(path, f"must be within ±2**53 (sent as a double, a larger integer arrives changed), got an "
                                f"integer of {value.bit_length()} bits")
    if depth > MAX_FREE_FORM_DEPTH:
        raise ConfigError(path, f"nested more than {MAX_FREE_FORM_DEPTH} mappings or lists deep (a job carries it in a "
                                "protobuf Struct, which workers cannot read that deep)")
    if isinstance(value, str):
        return _check_text(value, path)
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if isinstance(key, bool) or not isinstance(key, str | int):
                raise ConfigError(join_path(path, _printable(str(key))),
                                  f"keys must be strings (integers are sent as strings), got {_describe(key)}")
            name = _check_key(str(key), path)
            if name in out:
                raise ConfigError(join_path(path, name), "the key is given twice (as an integer and as a string)")
            out[name] = _plain_data(item, join_path(path, name), depth + 1)
        return out
    if isinstance(value, list | tuple):
        return [_plain_data(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value)]
    raise ConfigError(path, f"expected a string, number, boolean, null, list or mapping, got "
                            f"{type(value).__name__} ({str(value)[:40]})")


def _printable(text: str) -> str:
    """`text` with anything UTF-8 cannot encode (a lone surrogate) escaped, so an error naming it can be printed."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _as_text(value: str) -> str | None:
    """`value` as text UTF-8 can encode, or None. A pair of surrogate escapes (`"\\ud83d\\ude00"`, as json.dumps
    writes a character beyond the BMP) is joined into the one character it stands for; a lone surrogate
    (`"\\ud800"`) cannot be: it failed every job that carried it (protobuf strings are UTF-8) while the run
    itself went on."""
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        pass
    try:
        return value.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
    except UnicodeDecodeError:
        return None


def _check_text(value: str, path: str) -> str:
    text = _as_text(value)
    if text is None:
        raise ConfigError(path, f"not valid text: {_printable(value)[:60]!r} holds a lone surrogate "
                                "(an escape such as \\ud800 that is not half of a pair)")
    return text


def _check_key(key: str, path: str) -> str:
    text = _as_text(key)
    if text is None:
        raise ConfigError(join_path(path, _printable(key)),
                          "the key is not valid text: it holds a lone surrogate (an escape such as \\ud800)")
    return text


def _convert_int(value: Any, path: str) -> int:
    # Integral floats are accepted because YAML spells large step counts like 2.0e+5 as floats.
    if isinstance(value, float) and not isinstance(value, bool) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(path, f"expected int, got {_describe(value)}")
    return value


def _convert_union(tp: Any, value: Any, path: str) -> Any:
    members = typing.get_args(tp)
    if value is None:
        if type(None) in members:
            return None
        raise ConfigError(path, f"expected {_expected_name(tp)}, got null")
    candidates = [m for m in members if m is not type(None)]
    if len(candidates) == 1:
        return _convert(candidates[0], value, path)
    errors = []
    for member in candidates:
        try:
            return _convert(member, value, path)
        except ConfigError as exc:
            errors.append(exc.message)
    raise ConfigError(path, f"expected {_expected_name(tp)}, got {_describe(value)} ({'; '.join(errors)})")


def _convert_dict(tp: Any, value: Any, path: str) -> dict[Any, Any]:
    if value is None:
        raise ConfigError(path, NULL_SECTION)
    if not isinstance(value, Mapping):
        raise ConfigError(path, f"expected a mapping, got {_describe(value)}")
    args = typing.get_args(tp)
    key_tp, value_tp = args if args else (str, Any)
    result = {}
    for key, item in value.items():
        key_path = join_path(path, _printable(str(key)))
        result[_convert(key_tp, key, key_path)] = _convert(value_tp, item, key_path)
    return result


def _convert_sequence(tp: Any, value: Any, path: str) -> list[Any] | tuple[Any, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
        raise ConfigError(path, f"expected a list, got {_describe(value)}")
    origin = typing.get_origin(tp) or tp
    args = typing.get_args(tp)
    if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
        if len(args) != len(value):
            raise ConfigError(path, f"expected a list of {len(args)} items, got {len(value)}")
        return tuple(
            _convert(a, v, join_path(path, i)) for i, (a, v) in enumerate(zip(args, value, strict=True))
        )
    item_tp = args[0] if args else Any
    items = [_convert(item_tp, v, join_path(path, i)) for i, v in enumerate(value)]
    return tuple(items) if origin is tuple else items


def is_device(text: object) -> bool:
    """auto, cpu, cuda or cuda:N (N a GPU's index, ASCII digits): what a learner may be told to train on."""
    if not isinstance(text, str):
        return False
    index = text[5:]
    return text in ("auto", "cpu", "cuda") or (text.startswith("cuda:") and index.isascii() and index.isdigit()
                                               and len(index) <= 3 and (index == "0" or not index.startswith("0")))
