"""Fixtures shared across test folders."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist sets COLUMNS=80 in its workers: rich then wraps the CLIs' one-line messages that tests look
    # for (a path in them split over two lines). A serial run has no COLUMNS, nor do the processes tests start.
    os.environ.pop("COLUMNS", None)
    # Each of the -n workers runs torch in process and starts learners and actors: with torch's default of a
    # thread per core in all of them, their OpenMP threads fought for the cores (on two, as CI has, the DQN
    # smoke test took 69 s under `make test` and 11 s alone). One thread each, as `league run` gives its
    # processes; the processes tests start inherit it.
    for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_variable, "1")


PROCESS_MARK = "LEAGUE_TESTS_OF"
"""Set in each pytest process (an xdist worker too) to a value of its own, and so in every process its tests start,
whatever their session or group, also once their parent died: how the session finds what they left running."""
os.environ[PROCESS_MARK] = f"{os.getpid()}-{secrets.token_hex(4)}"


def _marked_processes() -> dict[int, str]:
    """Running processes (not zombies) that carry this pytest process's mark, but itself and multiprocessing's
    helpers that live as long as it does (its resource tracker, a fork server)."""
    needle = f"{PROCESS_MARK}={os.environ[PROCESS_MARK]}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, IndexError):
            continue
        if state != "Z" and "resource_tracker" not in command and "forkserver" not in command:
            found[int(entry.name)] = command
    return found


@pytest.fixture(scope="session", autouse=True)
def no_process_left_behind():
    """Processes the tests started must be gone when the session ends, also after a failed test: a leak (a group
    killed only while its leader ran, a process started outside a try) fails the session, naming what was left,
    which is killed (a review found leaks nothing reported)."""
    yield
    import signal
    import time

    deadline = time.monotonic() + 10  # (some are still exiting: a SIGTERM's stop)
    while (left := _marked_processes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not left, f"processes the tests started were still running when the session ended (killed now): {left}"


@pytest.fixture(autouse=True)
def torch_threads_restored():
    """The CLIs run in process (`league eval`, `league export`) set torch to one thread for the whole process:
    every later torch test in the worker then ran on one, its speed and sums' order hanging on what ran before."""
    import sys

    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else None
    yield
    torch = sys.modules.get("torch")
    if torch is not None and threads is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    """A fresh bearer-token file readable by its owner only, as an operator would create one."""
    path = tmp_path / "secrets" / "league_token"
    path.parent.mkdir()
    path.write_text(secrets.token_hex(16) + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture(scope="session", autouse=True)
def no_shared_memory_left_behind():
    """Chaos tests SIGKILL actors with their env workers and resource trackers; the next env manager that
    starts removes their shared-memory blocks, and this does it for the last ones once the session ends."""
    yield
    from actor_service.envs.env_manager.shm_blocks import remove_orphaned_blocks

    remove_orphaned_blocks()


def _utf8_safe(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Captured output of the tests that train under non-UTF-8 paths holds surrogate escapes; pytest-xdist sends
    reports to the controller as UTF-8 and a worker dies on such a string (the whole run aborts). Escaped here."""
    outcome = yield
    report = outcome.get_result()
    report.sections = [(title, _utf8_safe(content)) for title, content in report.sections]
