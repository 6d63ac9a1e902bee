"""The generated code is committed; it must match what `make proto` would write now."""

import filecmp
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_generated_code_is_fresh(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "tools" / "gen_proto.py"), "--out", str(tmp_path)], check=True)
    fresh = tmp_path / "common" / "proto"
    committed = ROOT / "common" / "proto"
    fresh_files = sorted(p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file())
    committed_files = sorted(
        p.relative_to(committed) for p in committed.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    )
    assert fresh_files == committed_files, "run `make proto`: generated file set differs"
    stale = [str(p) for p in fresh_files if not filecmp.cmp(fresh / p, committed / p, shallow=False)]
    assert not stale, f"run `make proto`: stale generated files {stale}"


def test_generated_package_imports_as_package():
    from common.proto.league.v1 import league_pb2, league_pb2_grpc

    assert league_pb2.DESCRIPTOR.package == "league.v1"
    assert hasattr(league_pb2_grpc, "LeagueServiceStub")
    assert hasattr(league_pb2_grpc, "LearnerServiceStub")
