#!/usr/bin/env bash
# The checks that need a GPU, in one short run (CI has none): the CUDA tests, the ComputationTask benchmark on
# the GPU, and a short league whose learners train there (`--device auto` picks CUDA) while CPU actors load
# their checkpoints, scored by `league eval` on the CPU.
#
#     tools/gpu_check.sh [LEAGUE_SECONDS]        # logs and a summary under $OUT (default /tmp/gpu_check)
#
# On a machine whose Python lacks this project's dependencies, put their wheels in .gpu-wheels/ (git-ignored
# through .git/info/exclude): they are installed first, without an index (such machines often have no network).
# For the lent H200 machines (Python 3.12, torch and most else already there), made beside the checkout with:
#   pip download --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#     --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --implementation cp --no-deps -d .gpu-wheels \
#     grpcio==1.85.1 grpcio-health-checking==1.85.1 grpcio-reflection==1.85.1 blake3 gymnasium \
#     farama-notifications open-spiel ml-collections 'protobuf>=6.31,<8'
#   pip wheel --no-deps -w .gpu-wheels trueskill
# and carried (`carry: [".gpu-wheels"]`); the run there: `OUT=$OUT tools/gpu_check.sh 150` (about 4 minutes).
set -uo pipefail
seconds=${1:-150}
OUT=${OUT:-/tmp/gpu_check}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
summary="$OUT/summary.txt"
: >"$summary"
step() {  # step NAME TIMEOUT COMMAND...: run with a time limit, its output in $OUT/NAME.log, its status in the summary
    local name=$1 limit=$2 start=$SECONDS rc
    shift 2
    timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    echo "$name: exit $rc in $((SECONDS - start)) s" | tee -a "$summary"
    tail -n 4 "$OUT/$name.log" | sed 's/^/    /' | tee -a "$summary"
}

if compgen -G ".gpu-wheels/*.whl" >/dev/null; then
    step install-wheels 120 "$PY" -m pip install --quiet --no-deps --no-index .gpu-wheels/*.whl
fi
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
step gpu-info 60 bash -c "nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; $PY -c 'import \
torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.is_available(), torch.cuda.get_device_name())'"
step cuda-tests 240 "$PY" -m pytest -q -p no:cacheprovider -o addopts= tests/unit/test_computation_cuda.py \
    tests/unit/test_computation.py
step bench-cuda-mlp 150 "$PY" bench/bench_computation.py --quick --device cuda
step bench-cuda-conv 150 "$PY" bench/bench_computation.py --quick --device cuda --obs 4x84x84
run_dir=$(mktemp -d)/run
step league-run $((seconds + 120)) "$PY" -m league_cli run --run-dir "$run_dir" --seconds "$seconds" --quiet
grep -h "training on" "$run_dir"/logs/*.log 2>/dev/null | sed 's/^/    /' | sort -u | tee -a "$summary"
echo "    ERROR/WARNING lines in the run's logs: $(cat "$run_dir"/logs/*.log 2>/dev/null | grep -c -E ' (ERROR|WARNING) ')" \
    | tee -a "$summary"
step league-eval 240 "$PY" -m league_cli eval --checkpoint "$run_dir/shared/main_player_default_0" --games 500 --json
tar -czf "$OUT/run_logs.tgz" -C "$run_dir" logs 2>/dev/null
rm -rf "$(dirname "$run_dir")"
