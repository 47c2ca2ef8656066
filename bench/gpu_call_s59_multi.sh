#!/usr/bin/env bash
# The default budget's rows (10m) of issue 33's goal table on a machine of several GPUs, where one
# is lent (nvidia-h100-x8: one model per GPU at a time, ~16 min a row with its peers), polled with
# bench/gpu_poll.sh 280 without a pause between polls. The models: the zoo's and the sampled
# architectures' of the 3m table, those where tune's stack holds a compile form whose autotuned
# form (46adccc) is the new candidate first (per-block compile kept: mistral, phi, stablelm,
# ministral3, bert, vit; whole-model: llama, qwen2, gemma, resnet, convnext), then the three that
# cleared 1.05 at 3m (ibert, convit_tiny; bert above), then the rest of the zoo.
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> bash bench/gpu_call_s59_multi.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
MODELS=zoo@mistral,zoo@phi,arch@stablelm,arch@ministral3,zoo@bert,zoo@vit,zoo@llama,zoo@qwen2,\
zoo@gemma,zoo@resnet,zoo@convnext,arch@ibert,arch@timm:convit_tiny,zoo@gpt2,zoo@mixtral,\
zoo@timm-vit SAMPLE= BUDGET=10m ROW_TIMEOUT=1320 bash bench/gpu_call_tune_rows.sh "$D"
