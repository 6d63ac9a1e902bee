"""JobsReady: how long-polling GetJobs on the coordinator's event loop learn that jobs were offered."""

import asyncio
import threading

from league_service.leases import WorkerRole
from league_service.server import JobsReady

ACTOR, LEARNER = WorkerRole.ACTOR, WorkerRole.LEARNER


def _offer_from_another_thread(ready: JobsReady, role: WorkerRole) -> None:
    thread = threading.Thread(target=ready.notify, args=(role,))
    thread.start()
    thread.join()


def test_an_offer_between_the_look_and_the_wait_wakes_the_poll():
    """The poll looked (nothing), then a launch thread offered a job before the poll started waiting: the
    wake-up must not be lost, or the poll sleeps its whole wait (up to 30 s) beside a ready job."""

    async def poll() -> bool:
        ready = JobsReady(asyncio.get_running_loop())
        with ready.waiting(ACTOR):
            event = ready.event(ACTOR)
            _offer_from_another_thread(ready, ACTOR)  # after the look, before the wait
            await ready.wait(event, 30.0)  # returns at the timeout, the event unset, when the wake-up was lost
            return event.is_set()

    assert asyncio.run(poll())


def test_offers_wake_only_their_role_and_nobody_when_nobody_waits():
    async def scenario() -> tuple[bool, float]:
        loop = asyncio.get_running_loop()
        ready = JobsReady(loop)
        ready.notify(ACTOR)  # nobody waits: nothing is scheduled
        with ready.waiting(LEARNER):
            event = ready.event(LEARNER)
            _offer_from_another_thread(ready, ACTOR)
            start = loop.time()
            await ready.wait(event, 0.3)  # times out: the offer was for actors
            learner_waited = loop.time() - start
        return event.is_set(), learner_waited

    woken, waited = asyncio.run(scenario())
    assert not woken and waited >= 0.25


def test_a_notify_after_the_loop_closed_is_ignored():
    loop = asyncio.new_event_loop()
    ready = JobsReady(loop)
    with ready.waiting(ACTOR):
        loop.close()
        ready.notify(ACTOR)  # the server stopped: no error in the coordinator's thread
