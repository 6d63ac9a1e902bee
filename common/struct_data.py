"""Free-form job sections (env kwargs, policy, learner settings) back from the protobuf Structs they travel in.

The coordinator sends these sections as Structs, which carry every number as a double. Actors and learners
must read them the same way, or an env built on both sides gets different kwargs: the learner builds the
job's env too (for its observation and action specs), and gymnasium's `max_episode_steps` or an OpenSpiel
game parameter such as `columns` refuses a float.
"""

from __future__ import annotations

import math
from typing import Any

from google.protobuf import json_format, struct_pb2


def struct_to_dict(struct: struct_pb2.Struct) -> dict[str, Any]:
    """A Struct as plain data; whole numbers come back as ints (typed configs turn an int back into a float
    where a float is wanted)."""
    return _whole_numbers_as_ints(json_format.MessageToDict(struct))


def _whole_numbers_as_ints(value: Any) -> Any:
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _whole_numbers_as_ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole_numbers_as_ints(v) for v in value]
    return value
