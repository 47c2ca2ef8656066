#!/usr/bin/env bash
# The device session of s62 (~30 minutes of device time): bench/gpu_call_s61.sh's rows with the
# zoo's 3m goal first (every zoo model; mistral, phi and swin missed it), then luke's 10m row:
# 1. mistral's and phi's 3m rows (0.980 and 0.976 before tune could compile the loss, fe50a01);
# 2. swin's 3m row with every peer (s55's row ran two of them);
# 3. luke's 10m row with loss-valid-rows' padded rows (0.740x on compile-model before them).
# Polled with bench/gpu_poll.sh without a pause between polls.
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> bash bench/gpu_call_s62.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
MODELS=zoo@mistral,zoo@phi SAMPLE= BUDGET=3m ROW_TIMEOUT=540 KEEP_GOING=1 \
    bash bench/gpu_call_tune_rows.sh "$D"
MODELS=zoo@swin SAMPLE= BUDGET=3m ROW_TIMEOUT=720 KEEP_GOING=1 \
    bash bench/gpu_call_tune_rows.sh "$D"
MODELS=arch@luke SAMPLE= BUDGET=10m ROW_TIMEOUT=900 KEEP_GOING=1 \
    bash bench/gpu_call_tune_rows.sh "$D"
echo done > "$D/DONE"
