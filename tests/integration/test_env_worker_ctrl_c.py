"""A Ctrl-C that reaches an env worker while it still starts (a `league actor --manager subprocess` in a terminal:
the SIGINT goes to the whole process group, env workers included). A spawned worker ignores SIGINT only once
its `worker_main` runs; before that, while the fresh interpreter unpickled its Process object (imports that
take a second or more on a busy machine), the signal was a KeyboardInterrupt traceback out of
`multiprocessing/spawn.py` in the actor's output, and a dead worker that the manager counted as an env failure.
The manager now starts its workers with SIGINT and SIGTERM blocked, and a worker unblocks them once it ignores
them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# In every spawned env worker (only there: its command line runs `spawn_main`), a SIGINT to the worker itself
# while its Process object is unpickled, at the import of the worker module: the moment the traceback showed,
# without depending on timing.
SITECUSTOMIZE = textwrap.dedent("""
    import os, signal, sys
    if "spawn_main" in " ".join(sys.orig_argv):
        def _interrupt(event, args):
            if event == "import" and args[0] == "actor_service.envs.env_manager.worker":
                os.kill(os.getpid(), signal.SIGINT)
        sys.addaudithook(_interrupt)
""")

CHILD = textwrap.dedent("""
    from actor_service.envs import SubprocessEnvManager, SubprocessEnvManagerConfig
    from tests.env_doubles import CountingEnv

    manager = SubprocessEnvManager([CountingEnv] * 2, SubprocessEnvManagerConfig(num_workers=1, max_retry=0))
    try:
        manager.launch()
        manager.step({0: 0, 1: 0})
        print("stepped", flush=True)
    finally:
        manager.close()
""")


def test_a_sigint_while_an_env_worker_starts_is_ignored_like_one_later(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    child = subprocess.Popen([sys.executable, "-c", CHILD], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = child.communicate(timeout=120)
    finally:
        try:  # the manager, its worker and its resource tracker, whatever happened
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        child.wait()
    assert child.returncode == 0, err
    assert out.strip() == "stepped"
    assert "KeyboardInterrupt" not in err and "Traceback" not in err, err
