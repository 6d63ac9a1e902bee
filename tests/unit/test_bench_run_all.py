"""bench/run_all.py: a benchmark that raises is reported in the file and in the exit status."""

from __future__ import annotations

from bench import run_all


def test_a_broken_benchmark_fails_the_run(tmp_path, monkeypatch):
    monkeypatch.setattr(run_all, "BENCHMARKS", (("bench.no_such_benchmark", "Broken"),))
    out = tmp_path / "latest.md"
    assert run_all.main(["--out", str(out)]) == 1
    assert "Did not run:" in out.read_text()


def test_an_only_that_matches_nothing_is_refused_and_writes_nothing(tmp_path):
    import pytest

    out = tmp_path / "latest.md"
    with pytest.raises(SystemExit) as exc:
        run_all.main(["--only", "bench_chekpoint", "--out", str(out)])
    assert exc.value.code == 2
    assert not out.exists()
