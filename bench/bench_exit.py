"""How long a worker process takes to exit, with and without common/quick_exit.py, in the same run.

The child does what a learner does before it stops (imports torch, builds a model and an Adam optimizer, takes
one step: torch._dynamo imported), says it is done and returns; timed from that line to its exit, which is the
interpreter's shutdown. Rounds alternate the two kinds; medians reported. `league run` waits for each of its
actors, then its learners, to exit when it stops, so this is paid (once per process kind) at every stop.

    python bench/bench_exit.py [--rounds N]
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
# First, even when ROOT is on PYTHONPATH: run as `python bench/X.py`, sys.path[0] is bench/, whose common.py
# would otherwise shadow the project's `common` package.
sys.path.insert(0, str(ROOT))

from bench.common import BenchRow, exit_on_sigterm  # noqa: E402

CHILD = """
import sys, torch
model = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))
optimizer = torch.optim.Adam(model.parameters())
model(torch.zeros(8, 4)).sum().backward()
optimizer.step()
if sys.argv[1] == "quick":
    from common.quick_exit import skip_final_collections_at_exit
    skip_final_collections_at_exit()
print("done", flush=True)
"""


def exit_seconds(kind: str) -> float:
    child = subprocess.Popen([sys.executable, "-c", CHILD, kind], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        line = child.stdout.readline()
        start = time.perf_counter()
        code = child.wait(timeout=120)
        elapsed = time.perf_counter() - start
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
    if line.strip() != "done" or code != 0:
        raise RuntimeError(f"the {kind} child failed (exit {code}, said {line!r})")
    return elapsed


def main(argv: list[str] | None = None) -> list[BenchRow]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of each kind (default 7)")
    args = parser.parse_args(argv)
    exit_on_sigterm()  # (its temporary files are removed when stopped so, not only at Ctrl-C)
    rounds = args.rounds or (3 if args.quick else 7)
    times: dict[str, list[float]] = {"quick": [], "plain": []}
    for _ in range(rounds):
        for kind in times:
            times[kind].append(exit_seconds(kind))
    quick, plain = (statistics.median(times[k]) for k in ("quick", "plain"))
    print(f"exit of a process that trained with torch: {quick * 1e3:.0f} ms with quick_exit, {plain * 1e3:.0f} ms "
          f"without (medians of {rounds}); ratio {quick / plain:.2f}")
    return [BenchRow("exit of a process that trained with torch (wall)", quick * 1e3, "ms",
                     "the same exit without quick_exit", plain * 1e3, "informational", None)]


if __name__ == "__main__":
    main(sys.argv[1:])
