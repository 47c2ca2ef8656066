#!/usr/bin/env bash
# The next device session after s63 (~30 minutes of device time): issue 33's default-budget
# goal (vs_best_peer >= 1.05 at 10m on half of the goal's models; s63: 3 rows, all met), with
# the rows most likely to meet it first, then two stale 3m rows.
# 1. 10m: squeezebert and xlm (masked LMs outside the zoo: their 3m searches kept one compile
#    form, and loss-valid-rows, 1.18x on luke's CUDA graphs in s63, comes after it), timm's
#    convit_tiny (1.087 at 3m), ibert (its 10m row, 1.110, predates loss-valid-rows on masked
#    LMs), the zoo's resnet and convnext (channels-last and the autotuned form on CUDA graphs);
# 2. 3m: timm's inception_resnet_v2 (its row predates compile-blocks there, d538ca7) and
#    glm_moe_dsa (its row predates the settled-baseline stop of sides one at a time).
# On a machine of several GPUs the models are dealt over them (bench/gpu_call_tune_rows.sh),
# so a 4-GPU machine times the six 10m rows side by side in about two rows' time.
# Polled with bench/gpu_poll.sh without a pause between polls.
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> bash bench/gpu_call_s64.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
MODELS=arch@squeezebert,arch@xlm/masked-lm,arch@timm:convit_tiny,arch@ibert,zoo@resnet,zoo@convnext \
    SAMPLE= BUDGET=10m ROW_TIMEOUT=960 KEEP_GOING=1 bash bench/gpu_call_tune_rows.sh "$D"
MODELS=arch@timm:inception_resnet_v2,arch@glm_moe_dsa SAMPLE= BUDGET=3m ROW_TIMEOUT=720 \
    KEEP_GOING=1 bash bench/gpu_call_tune_rows.sh "$D"
echo done > "$D/DONE"
