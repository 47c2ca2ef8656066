#!/usr/bin/env bash
# A device session of issue 33 after s57 (an H100 wanted: the goal table's GPU), polled with
# bench/gpu_poll.sh 270 without a pause between polls (a machine goes back 30 s after a call).
# First ab's GPU tests (the memory gate's test now counts the baseline's first window: sides
# alternate in windows of steps on CUDA since 3d91aa4, not yet run on a GPU), then the zoo's phi
# and mistral at 3m beside every peer (s55, step by step: float8 on per-block compile read 1.000x
# and 0.994x and was left out, 0.970 and 0.914 of torchtitan's float8 recipe; s57c's windows
# read 1.027x and 1.092x), then the autotuned compile form's GPU test (pending since s54).
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> bash bench/gpu_call_s58.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
bash bench/gpu_session_tests.sh "$D" 240 tests/ab/test_ab_gpu.py
MODELS=zoo@phi,zoo@mistral SAMPLE= BUDGET=3m ROW_TIMEOUT=600 KEEP_GOING=1 \
    bash bench/gpu_call_tune_rows.sh "$D"
mv "$D/t" "$D/t_ab"  # the first tests kept apart: the next run writes $D/t again
bash bench/gpu_session_tests.sh "$D" 300 tests/zoo/test_compile_graphs_gpu.py -k autotuned
echo done > "$D/DONE"
