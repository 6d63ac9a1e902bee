"""The learner's typed settings: the league config's ``learner`` section and the process flags.

The ``learner`` section travels inside every learn job as a protobuf Struct (numbers as doubles), so it is
parsed with `common.typed_config.from_mapping`: ``256.0`` becomes the int 256, a typo is an
error naming ``learner.<field>``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from common.config import is_device

MAX_CHUNK_BYTES = 64 * 2**20
"""Largest TrajectoryChunk the learner's server accepts (its gRPC receive limit; fixed before any job)."""


@dataclass(frozen=True)
class LearnerSettings:
    """What the process is told on its command line."""

    coordinator: str
    shared_root: Path
    worker_id: str
    host: str = "127.0.0.1"
    port: int = 0
    advertise: str = ""
    """The address actors stream to; empty: host:bound_port (the machine's hostname for a wildcard host)."""
    token: str | None = field(default=None, repr=False)  # (never in a printed settings object)
    insecure: bool = False
    """Serve a non-loopback host without a token (the operator said --insecure)."""
    tls_ca: Path | None = None
    """CA certificate: reach the coordinator over TLS."""
    tls_server_name: str | None = None
    """The name the coordinator's certificate is checked against (None: the host dialled)."""
    tls_cert: Path | None = None
    """Certificate chain and key of the trajectory server. Actors given a CA reach learners over TLS too, so a
    learner that reaches the coordinator over TLS must serve TLS itself."""
    tls_key: Path | None = None
    device: str = "auto"
    get_job_wait_s: float = 5.0
    """Long-poll of one GetJob call."""
    max_backoff_s: float = 10.0
    """Cap of the exponential backoff while the coordinator is away."""
    publish_timeout_s: float | None = 300.0
    """A checkpoint publish or read still under way after this long is stuck (a network filesystem whose server
    went away): the heartbeat stops renewing the learn job's lease, so the league can bind the player to another
    learner. Generous: a large checkpoint on a slow share legitimately takes seconds (None: no limit)."""

    env_build_timeout_s: float | None = 300.0
    """Building the job's env to read its observation and action spaces may take this long (None: no limit):
    an env constructor that hangs (a simulator it waits for) left the learner silent for good, holding its
    player, while the actors gave up on the same constructor after their reset timeout."""

    stop_train_s: float = 5.0
    """At a stop, the most time spent training on what was accepted before the final checkpoint; what is left
    then is dropped (logged). A DQN learner owes replay updates for every queued chunk, tens of seconds of them:
    unbounded, its stop outlasted league run's grace and was killed before its final checkpoint."""

    stream_idle_timeout_s: float = 60.0
    """A trajectory stream whose client sent nothing for this long is cancelled, so that frozen or stray
    clients cannot hold the learner's stream slots (our actors end a stream after 0.05 s of quiet)."""

    def __post_init__(self) -> None:
        if not self.coordinator:
            raise ValueError("coordinator: HOST:PORT is required (--coordinator or $LEAGUE_COORDINATOR)")
        if not self.worker_id:
            raise ValueError("worker_id: must not be empty")
        if self.publish_timeout_s is not None and not (math.isfinite(self.publish_timeout_s)
                                                       and self.publish_timeout_s > 0):
            raise ValueError(f"publish_timeout_s: must be > 0 seconds or None, got {self.publish_timeout_s}")
        if not (math.isfinite(self.stop_train_s) and self.stop_train_s >= 0):
            raise ValueError(f"stop_train_s: must be >= 0 seconds, got {self.stop_train_s}")
        if not (math.isfinite(self.stream_idle_timeout_s) and self.stream_idle_timeout_s > 0):
            raise ValueError(f"stream_idle_timeout_s: must be > 0 seconds, got {self.stream_idle_timeout_s}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: must be within [0, 65535], got {self.port}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together: give both, or neither")
        if self.tls_ca is not None and self.tls_cert is None:
            raise ValueError(
                "--tls-cert: the coordinator is reached over TLS (--tls-ca), so actors reach this learner over TLS "
                "too: give --tls-cert/--tls-key for the trajectory server"
            )
        if self.tls_cert is not None and self.tls_ca is None:
            # Actors have one --tls-ca for the coordinator and the learners: with a plaintext coordinator they
            # have none, and could never stream to this learner (it bound its player, and every job's chunks were
            # resent until the job failed; a review).
            raise ValueError(
                "--tls-ca: this learner serves trajectories over TLS (--tls-cert), so its actors need a CA, and they "
                "reach the coordinator with the same one: give --tls-ca for a coordinator over TLS, or serve "
                "without --tls-cert/--tls-key beside a plaintext coordinator"
            )
        if not is_device(self.device):
            raise ValueError(f"device: expected auto, cpu, cuda or cuda:N, got {self.device!r}")
