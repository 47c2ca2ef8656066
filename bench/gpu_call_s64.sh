#!/usr/bin/env bash
# The next device session after s63 (~30 minutes of device time), in order:
# 1. 3m: timm's inception_resnet_v2 first. Its row (e029f3b, H200 s46) is the one where tune
#    answered "nothing pays" while a peer gave >= 1.05x (reduce-overhead compile 3.10x), which
#    issue 33 says must never happen; it predates the stop inside a compiling step, the CUDA
#    graphs fallback (compile-model:backend=cudagraphs) and compile-blocks there (d538ca7).
# 2. 10m, issue 33's default-budget goal (vs_best_peer >= 1.05 on half of the goal's models;
#    s63: 3 rows, all met), the rows most likely to meet it first: squeezebert and xlm (masked
#    LMs outside the zoo: their 3m searches kept one compile form, and loss-valid-rows, 1.18x on
#    luke's CUDA graphs in s63, comes after it; xlm's XLMWithLMHeadModel takes it since 60e06f5),
#    timm's convit_tiny (1.087 at 3m), ibert (its 10m row, 1.110, predates loss-valid-rows on
#    masked LMs), the zoo's resnet and convnext (channels-last and the autotuned form on CUDA
#    graphs);
# 3. 3m: glm_moe_dsa (its row predates the settled-baseline stop of sides one at a time).
# On a machine of several GPUs the models are dealt over them (bench/gpu_call_tune_rows.sh),
# so a 4-GPU machine times the six 10m rows side by side in about two rows' time.
# Polled with bench/gpu_poll.sh without a pause between polls.
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> bash bench/gpu_call_s64.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
MODELS=arch@timm:inception_resnet_v2 SAMPLE= BUDGET=3m ROW_TIMEOUT=1200 KEEP_GOING=1 \
    bash bench/gpu_call_tune_rows.sh "$D"
MODELS=arch@squeezebert,arch@xlm/masked-lm,arch@timm:convit_tiny,arch@ibert,zoo@resnet,zoo@convnext \
    SAMPLE= BUDGET=10m ROW_TIMEOUT=1200 KEEP_GOING=1 bash bench/gpu_call_tune_rows.sh "$D"
MODELS=arch@glm_moe_dsa SAMPLE= BUDGET=3m ROW_TIMEOUT=900 KEEP_GOING=1 \
    bash bench/gpu_call_tune_rows.sh "$D"
echo done > "$D/DONE"
