"""A disk with no space left, as `os.statvfs` reports it: what the full-disk messages are tested against."""

from __future__ import annotations

import os

import pytest

FULL_DISK_STATVFS = os.statvfs_result((4096, 4096, 512, 0, 0, 1000, 900, 900, 0, 255))
"""4 KiB blocks, 512 of them, none free (nor for an unprivileged user)."""


def pretend_full_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """`os.statvfs` says every filesystem is full."""
    monkeypatch.setattr(os, "statvfs", lambda path: FULL_DISK_STATVFS)
