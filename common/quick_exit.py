"""Process exit without the interpreter's last garbage collections.

A process that imported torch spends ~1.2 s of CPU exiting on these machines, ~1.7 s once it built an optimizer
(torch._dynamo imported): CPython's shutdown runs its cyclic collector over torch's hundreds of thousands of
module objects, which the OS frees a moment later anyway. Every learner and actor paid it at each stop (a
`league run` stopping waits for its actors, then its learners, one after the other), as did each `league eval`.
`gc.freeze()` at exit puts every object into the collector's permanent generation, so those passes find nothing
to do, while the rest of the exit happens as before: atexit handlers (logging's flush, multiprocessing's and
shared memory's clean-up, weakref finalizers), thread joins, objects freed by reference count. Only garbage
in reference cycles at exit is not finalized: files that matter are closed explicitly (checkpoints and status
files are written atomically, the TensorBoard writer is closed at the stop).
"""

from __future__ import annotations

import atexit
import gc

_registered = False


def skip_final_collections_at_exit() -> None:
    """Freeze the collector as the interpreter exits (an atexit handler: a process that goes on, such as a test
    calling a command's main in-process, collects as usual until it exits). Once per process."""
    global _registered
    if not _registered:
        atexit.register(gc.freeze)
        _registered = True
