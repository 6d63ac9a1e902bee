"""A league status larger than gRPC's default 4 MB message limit is still served and shown by `league status`.

The status lists every player, payoff entry and registered worker, so it grows with the league: the default
league snapshots ~550 historical players an hour on 2 cores (each with ~4 payoff entries), and every actor
process that starts registers a worker. Here the status is made large with workers whose ids, hostnames and
endpoints have the longest lengths the coordinator accepts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from common.proto.league.v1 import league_pb2 as pb
from league_service.coordinator_testing import league_stub, running_coordinator, small_league_config
from league_service.wire import MAX_ID_CHARS

WORKERS = 6_000  # ~800 bytes each in the status: ~4.8 MB


def test_a_status_over_four_megabytes_is_served_and_shown(tmp_path):
    with running_coordinator(small_league_config(), tmp_path, needs_learner=False) as server:
        channel, stub = league_stub(server.address)
        with channel:
            def register(i: int) -> None:
                stub.RegisterWorker(pb.RegisterWorkerRequest(
                    worker_id=f"actor-{i:06d}-".ljust(MAX_ID_CHARS, "w"), role=pb.WORKER_ROLE_ACTOR,
                    hostname=f"host-{i}-".ljust(MAX_ID_CHARS, "h"), data_endpoint="".ljust(MAX_ID_CHARS, "e"),
                ))

            with ThreadPoolExecutor(8) as pool:
                list(pool.map(register, range(WORKERS)))
        proc = subprocess.run(
            [sys.executable, "-m", "league_cli", "status", "--addr", server.address, "--json", "--timeout", "60"],
            capture_output=True, text=True, timeout=120,
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(proc.stdout) > 4 * 2**20
    assert len(json.loads(proc.stdout)["workers"]) == WORKERS
