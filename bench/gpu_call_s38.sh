#!/usr/bin/env bash
# Device session s38 (background, polled by bench/gpu_poll.sh): the GPU tests (all but the zoo's
# float64 references, run at s32a/s33a) into $D/t, then bench/gpu_call_vit_check.sh (vit's
# compile-blocks A/B alone and after compile-model, then the goal rows of MODELS).
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> MODELS="zoo@gemma,zoo@t5" BUDGET=3m bash bench/gpu_call_s38.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
mkdir -p "$D/t/gpu_tests"
timeout 420 python -m pytest -q -p no:cacheprovider -rfEs -m gpu tests --ignore=tests/zoo \
    > "$D/t/gpu_tests/pytest.log" 2>&1
echo "rc=$?" >> "$D/t/gpu_tests/pytest.log"
(cd "$D/t" && tar -czf round.tgz gpu_tests)
exec bash bench/gpu_call_vit_check.sh "$D"
