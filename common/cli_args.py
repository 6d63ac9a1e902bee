"""argparse types for numbers the servers' flags take, so that a bad value is a usage error naming the flag.

Why: without them `--port 70000` bound port 4464 (gRPC wraps it) and `--lease-timeout 0` or `--seed -1`
ended in a traceback from deep inside the process.
"""

from __future__ import annotations

import argparse
import math


def port(text: str) -> int:
    """A TCP port, 0 (any free one) to 65535."""
    value = _int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port from 0 to 65535, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_seconds(text: str) -> float:
    value = _float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text}")
    return value


def non_negative_seconds(text: str) -> float:
    value = _float(text)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
