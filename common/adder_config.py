"""`AdderConfig`: a collect job's ``adder_kwargs``, how actors cut and send the launch player's trajectory.

Shared so that the coordinator checks a league config's ``adder_kwargs`` at load (a typo stops `league run`
at startup, naming the key) with the same rules the actor applies to every job it runs.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_UNROLL_LEN = 32
MAX_UNROLL_LEN = 4096
"""The longest row a learner accepts. Rows of one PPO batch are padded to the longest among them, so one
row far longer than the rest would multiply the batch's memory (SB3's longest usual ``n_steps`` is 2048)."""


@dataclass(frozen=True)
class AdderConfig:
    unroll_len: int = DEFAULT_UNROLL_LEN
    """Transitions per trajectory row (rows end earlier at a truncation, an env failure or the job's end)."""
    chunks_in_flight: int = 0
    """The most chunks the actor holds that the learner has not taken yet (queued + streaming); the rollout
    waits beyond that. 0: the actor's own sender settings (8 queued + up to 16 per stream), sized for
    throughput. Every chunk held is data that ages while the learner trains on the ones before it, so an
    on-policy learner with small batches (solo CartPole: one 256-sample update per chunk) learns faster
    with 2."""

    def __post_init__(self) -> None:
        if not 1 <= self.unroll_len <= MAX_UNROLL_LEN:
            raise ValueError(f"unroll_len must be in [1, {MAX_UNROLL_LEN}], got {self.unroll_len}")
        if self.chunks_in_flight != 0 and self.chunks_in_flight < 2:
            raise ValueError(f"chunks_in_flight must be 0 (the actor's default) or >= 2 (one queued, one "
                             f"streaming), got {self.chunks_in_flight}")
