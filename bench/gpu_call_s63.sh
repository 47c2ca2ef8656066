#!/usr/bin/env bash
# The next device session after s62 (~30 minutes of device time), in order (swin first since s63:
# it is the zoo's last row below the 3m goal, and a 3m row is the surer to finish):
# 1. luke's 10m row: loss-valid-rows finds its rows eagerly since 57dabf5, so on top of
#    whole-model compile's CUDA graphs each graph meets one size per bucket (s62: 0.966x on
#    compile-model with nine sizes; s61's row missed at 1.013 of reduce-overhead compile);
# 2. swin's 3m row with every peer (s62 timed tune's side only, 4.317x; s55's row 0.977);
# 3. timm's inception_resnet_v2 at 3m: its row (a14dbe0) predates d538ca7, since which
#    compile-blocks applies there (3 programs, its single layers eager);
# 4. glm_moe_dsa at 3m: its row (e2cb1d7, s52) predates the settled-baseline stop of sides one
#    at a time (its eager baseline's 20 steps of 1.2 s were 24 s of each A/B), and read 0.956 of
#    whole-model compile, which the budget never reached;
# 5. squeezebert's 10m row (a masked LM outside the zoo), if time is left.
# Polled with bench/gpu_poll.sh without a pause between polls.
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> bash bench/gpu_call_s63.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
MODELS=zoo@swin SAMPLE= BUDGET=3m ROW_TIMEOUT=720 KEEP_GOING=1 \
    bash bench/gpu_call_tune_rows.sh "$D"
MODELS=arch@luke SAMPLE= BUDGET=10m ROW_TIMEOUT=900 KEEP_GOING=1 \
    bash bench/gpu_call_tune_rows.sh "$D"
MODELS=arch@timm:inception_resnet_v2 SAMPLE= BUDGET=3m ROW_TIMEOUT=720 KEEP_GOING=1 \
    bash bench/gpu_call_tune_rows.sh "$D"
MODELS=arch@glm_moe_dsa SAMPLE= BUDGET=3m ROW_TIMEOUT=720 KEEP_GOING=1 \
    bash bench/gpu_call_tune_rows.sh "$D"
MODELS=arch@squeezebert SAMPLE= BUDGET=10m ROW_TIMEOUT=900 KEEP_GOING=1 \
    bash bench/gpu_call_tune_rows.sh "$D"
echo done > "$D/DONE"
