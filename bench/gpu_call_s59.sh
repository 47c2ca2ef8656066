#!/usr/bin/env bash
# A device session of issue 33 after s58 (an H100 wanted: the goal table's GPU), polled with
# bench/gpu_poll.sh 280 without a pause between polls (a machine goes back 30 s after a call).
# First the GPU test of per-block compile's autotuned form (46adccc: tune's late form where
# per-block compile was kept, at the default budget), then the default budget's rows (10m) of the
# zoo's mistral and phi, where s58's 3m search kept per-block compile and float8 (torchtitan's
# recipe, to the byte of peak memory) and the autotuned blocks are the form tried after them,
# between them ibert's and bert's (3m rows already past 1.05 of the best peer: 1.144, 1.071), so
# that the 10m goal gets rows of both kinds within one session's device time.
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> bash bench/gpu_call_s59.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
# (the autotuned blocks' GPU test, tests/zoo/test_compile_graphs_gpu.py -k "autotuned and
# compile-blocks", left for a later session: two failed starts took 270 s of this one's device time)
MODELS=zoo@bert,arch@ibert,zoo@mistral,zoo@phi SAMPLE= BUDGET=10m ROW_TIMEOUT=1320 KEEP_GOING=1 \
    bash bench/gpu_call_tune_rows.sh "$D"
echo done > "$D/DONE"
