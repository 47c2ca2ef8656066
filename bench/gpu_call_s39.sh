#!/usr/bin/env bash
# The next device session's job (background, polled by bench/gpu_poll.sh): the GPU tests s38's
# 420 s limit did not reach (tests/tune/test_gpu_tune.py, tests/workloads/test_gpu_workloads.py)
# into $D/t, then the goal rows of MODELS (bench/gpu_call_tune_rows.sh).
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> MODELS="zoo@t5,zoo@swin,zoo@mistral" BUDGET=3m bash bench/gpu_call_s39.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
mkdir -p "$D/t/gpu_tests"
timeout 360 python -m pytest -q -p no:cacheprovider -rfEs -m gpu tests/tune/test_gpu_tune.py \
    tests/workloads/test_gpu_workloads.py > "$D/t/gpu_tests/pytest.log" 2>&1
echo "rc=$?" >> "$D/t/gpu_tests/pytest.log"
(cd "$D/t" && tar -czf round.tgz gpu_tests)
exec bash bench/gpu_call_tune_rows.sh "$D"
