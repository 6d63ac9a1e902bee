"""`make bench`: run every benchmark of the project in one go and write their tables to bench/results/latest.md.

Each row holds the figure, the baseline measured in the same run, the ratio, the goal, and the machine
(cores, CPU model) and date. A benchmark module exposes `main(argv) -> list[BenchRow]`.

BENCHMARKS.md is the project's record: tables copied from such runs, each with the command that produced it,
and what was learned from them, written by hand. This script never rewrites it (an earlier version did, and
would have dropped every note).
"""

from __future__ import annotations

import argparse
import importlib
import pathlib
import sys
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import BenchRow, Terminated, exit_on_sigterm, machine_line  # noqa: E402

# (module, title) in the order they run.
BENCHMARKS: tuple[tuple[str, str], ...] = (
    ("bench.bench_env_manager", "Env managers"),
    ("bench.bench_computation", "ComputationTask.learn"),
    ("bench.bench_checkpoint", "Checkpoint publish + load"),
    ("bench.bench_exit", "Worker process exit"),
    ("bench.bench_coordinator", "Coordinator RPC"),
    ("bench.bench_load", "Load: 200 simulated workers against one coordinator"),
    ("bench.bench_league_scale", "Opponent choice as the league grows"),
    ("bench.bench_restore", "Coordinator restart as the league grows"),
    ("bench.bench_system", "System throughput and learning"),
    ("bench.bench_episode_returns", "Returns reported by step-budget jobs"),
    ("bench.bench_pendulum", "A Box action: solo Pendulum against SB3"),
    ("bench.bench_league", "Default connect-four league: learning outcome"),
)


def render(results: list[tuple[str, str, list[BenchRow] | str, float]], command: str) -> str:
    lines = [
        "# Benchmarks",
        "",
        f"Produced by `{command}` on {machine_line()}.",
        "Every baseline was measured in the same run as the figure it is compared with; figures on these",
        "machines vary about 2x from minute to minute, so compare ratios, not absolute numbers across runs.",
        "",
    ]
    for module, title, rows, seconds in results:
        lines += [f"## {title}", "", f"`{module}` ({seconds:.0f} s)", ""]
        if isinstance(rows, str):
            lines += ["Did not run:", "", "```", rows.strip(), "```", ""]
            continue
        lines += [
            "| metric | value | baseline | baseline value | ratio | goal | met |",
            "| --- | ---: | --- | ---: | ---: | --- | --- |",
        ]
        for r in rows:
            met = "" if r.met is None else ("yes" if r.met else "**no**")
            lines.append(
                f"| {r.metric} | {r.value:,.2f} {r.unit} | {r.baseline_name} | {r.baseline_value:,.2f} | "
                f"{r.ratio:.2f} | {r.goal} | {met} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short runs (smoke-check the benchmarks)")
    parser.add_argument("--only", action="append", default=[], help="run only modules containing this text")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "results" / "latest.md")
    args = parser.parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    unknown = [s for s in args.only if not any(s in module for module, _ in BENCHMARKS)]
    if unknown:  # before anything runs: a typo would overwrite --out with a file of no tables
        parser.error(f"--only {', '.join(unknown)}: no benchmark module contains it "
                     f"({', '.join(module for module, _ in BENCHMARKS)})")
    exit_on_sigterm()
    results = []
    for module, title in BENCHMARKS:
        if args.only and not any(s in module for s in args.only):
            continue
        print(f"\n=== {title} ({module})", flush=True)
        start = time.monotonic()
        try:
            mod = importlib.import_module(module)
            rows: list[BenchRow] | str = mod.main(["--quick"] if args.quick else [])
        except Terminated:  # a SIGTERM: the run stops (each benchmark has stopped what it started)
            raise
        except (Exception, SystemExit):  # a broken benchmark (or one refusing its arguments: argparse exits) is
            rows = traceback.format_exc()  # reported in the file, and the others still run
            print(rows, file=sys.stderr)
        results.append((module, title, rows, time.monotonic() - start))
    command = "make bench" if not given else " ".join(["python bench/run_all.py", *given])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(results, command))
    print(f"\nwrote {args.out}")
    failed = [module for module, _, rows, _ in results if isinstance(rows, str)]
    if failed:  # reported in the file, and in the exit status (`make bench` fails)
        print(f"did not run: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
