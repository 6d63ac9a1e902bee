"""Launch slots: how many jobs an active player may have in flight (the seed's LimitedSpaceContainer).

Not thread-safe by itself: the league changes it only under its lock.
"""

from __future__ import annotations

from league_service.league_errors import SlotError


class LimitedSpaceContainer:
    def __init__(self, min_val: int, max_val: int) -> None:
        if not 0 <= min_val <= max_val:
            raise ValueError(f"need 0 <= min_val <= max_val, got {min_val}, {max_val}")
        self.min_val = min_val
        self.max_val = max_val
        self.cur = min_val

    def get_residual_space(self) -> int:
        # `cur` may exceed `max_val` after a restart with a lowered limit (Roster.from_state_dict).
        return max(0, self.max_val - self.cur)

    def acquire_space(self) -> bool:
        """Take one slot if there is one free."""
        if self.cur >= self.max_val:
            return False
        self.cur += 1
        return True

    def release_space(self) -> None:
        """Give one slot back; releasing more than was taken is a bug of the caller, so it raises."""
        if self.cur <= self.min_val:
            raise SlotError("launch_player", "no launch slot is held (released twice?)")
        self.cur -= 1

    @property
    def used(self) -> int:
        return self.cur - self.min_val
