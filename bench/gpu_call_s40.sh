#!/usr/bin/env bash
# The next device session's job (background, polled by bench/gpu_poll.sh): the GPU test added
# after s39 (tests/ab/test_ab_memory.py: an A/B side's resident bytes with torchao's 8-bit
# state) into $D/t, then the goal rows (bench/gpu_call_tune_rows.sh: MODELS, SAMPLE, BUDGET,
# spread over the machine's GPUs).
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> MODELS="zoo@t5,zoo@nanogpt" SAMPLE=8:33 BUDGET=3m bash bench/gpu_call_s40.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
mkdir -p "$D/t/gpu_tests"
timeout 120 python -m pytest -q -p no:cacheprovider -rfEs -m gpu tests/ab/test_ab_memory.py \
    > "$D/t/gpu_tests/pytest.log" 2>&1
echo "rc=$?" >> "$D/t/gpu_tests/pytest.log"
(cd "$D/t" && tar -czf round.tgz gpu_tests)
exec bash bench/gpu_call_tune_rows.sh "$D"
