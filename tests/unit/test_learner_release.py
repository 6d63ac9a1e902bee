"""A stopping learner's release: final checkpoint, report, FinishJob(RELEASED). A reviewer found that a final
publish withdrawn at its commit (the lease lapsed while the file was written), for a player with nothing
published yet, made `release` raise ("nothing published yet") before FinishJob: the learner died with a
traceback and the player waited for the lease to expire."""

from __future__ import annotations

from common.checkpoint_store import CheckpointStore
from common.learner_config import LearnerConfig
from common.proto.league.v1 import league_pb2
from learner_service.league_client import LearnJob
from learner_service.publisher import CheckpointPublisher
from learner_service.servicer import DataPlane
from learner_service.session import LearnSession, SessionContext
from tests.unit.test_learner_trainer import _trainer


class _Lease:
    """Held when `release` asks, gone by the time the commit asks."""

    def __init__(self) -> None:
        self.asked = 0

    @property
    def held(self) -> bool:
        self.asked += 1
        return self.asked == 1


class _Client:
    def __init__(self) -> None:
        self.reports: list[str] = []
        self.finished: list[tuple[str, int]] = []

    def update_player(self, *args, **kwargs):
        self.reports.append(args)

    def finish(self, job_id, status, *args, **kwargs):
        self.finished.append((job_id, status))


def test_a_withdrawn_final_publish_of_a_player_with_nothing_published_still_releases_the_job(tmp_path):
    lease, client = _Lease(), _Client()
    publisher = CheckpointPublisher(CheckpointStore(tmp_path, publish_guard=lambda: lease.held), "p", "w")
    context = SessionContext(client, DataPlane(), tmp_path, "cpu", lambda: True, lambda *a: None)
    job = LearnJob("job-1", "p", "", 0, "CartPole-v1", {}, {}, {}, 30.0, 0.0)
    session = LearnSession(context, job, lease, _trainer(), publisher, LearnerConfig(), seed=0)
    session.release()
    assert client.finished == [("job-1", league_pb2.FINISH_STATUS_RELEASED)]
    assert client.reports == [] and publisher.store.latest("p") is None
