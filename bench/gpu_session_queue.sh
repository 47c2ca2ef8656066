#!/usr/bin/env bash
# The rows and probes queued for issue 33's device sessions since s46, run after a session's own
# rows (bench/gpu_call_s46.sh, bench/gpu_call_s47.sh): test_efficientnet at 3m timed again (s45
# timed 10 steps of 5 ms a variant), channels-last on three convnets alone and under whole-model
# compile (no lever yet: is one worth it?), swin at 3m, whole-model compile against its
# max-autotune mode, then llama at the default budget, its peers after it. Each probe is packed
# as $D/<letter>/round.tgz (bench/gpu_poll.sh brings it back).
# Usage (on the device, after bench/gpu_session_setup.sh): bash bench/gpu_session_queue.sh D
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
source bench/gpu_session_probe.sh  # probe LETTER FOLDER TIMEOUT_S MODELS STACKS
MODELS=arch@timm:test_efficientnet SAMPLE= BUDGET=3m KEEP_GOING=1 bash bench/gpu_call_tune_rows.sh "$D"
probe c channels_last_probe 300 zoo@resnet,zoo@convnext,arch@timm:test_efficientnet \
    "compile-model;channels-last+compile-model;channels-last"
MODELS=zoo@swin SAMPLE= BUDGET=3m KEEP_GOING=1 bash bench/gpu_call_tune_rows.sh "$D"
probe p stack_probe 400 zoo@llama,zoo@vit,zoo@gpt2 "compile-model;compile-model:mode=max-autotune"
MODELS=zoo@llama SAMPLE= BUDGET=10m ROW_TIMEOUT=1320 KEEP_GOING=1 bash bench/gpu_call_tune_rows.sh "$D"
