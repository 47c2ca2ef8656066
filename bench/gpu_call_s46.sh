#!/usr/bin/env bash
# A device session of issue 33 (background, polled by bench/gpu_poll.sh), for a 30-minute budget,
# as far as it goes, the goal table's gaps first: the GPU tests (ab's sides one at a time; a
# compiled dropout trial compiles once; an A/B stops at a look once decided), then t5 at 3m (a
# miss in s45: the confirmation of compile-model's 2.96x starved by a third compile form, fixed
# after it), then the sampled architectures outside the zoo (8:33) that have no row yet, at 3m
# (ibert's positions fixed after s45; gemma3, longcat_flash and glm_moe_dsa tuned again at levers
# memory's fit where the GPU is an H100), then test_efficientnet timed again (its s45 row timed
# 10 steps of 5 ms a variant), then channels-last probed on three convnets (alone and under
# whole-model compile: no lever yet), then swin at 3m, the max-autotune probe, llama at 10m, and
# the committed H200 rows timed again beside every peer with the KV cache off (no search).
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> bash bench/gpu_call_s46.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
bash bench/gpu_session_tests.sh "$D" 180 tests/ab/test_ab_gpu.py tests/tune/test_gpu_tune.py -k "one_at_a_time or compiles_once or stops_its_timed_steps"
MODELS=zoo@t5 SAMPLE= BUDGET=3m KEEP_GOING=1 bash bench/gpu_call_tune_rows.sh "$D"
MODELS=arch@squeezebert,arch@timm:inception_resnet_v2,arch@timm:hiera_tiny_224,arch@ibert,arch@gemma3,arch@glm_moe_dsa,arch@longcat_flash \
    SAMPLE= BUDGET=3m ROW_TIMEOUT=900 KEEP_GOING=1 bash bench/gpu_call_tune_rows.sh "$D"
bash bench/gpu_session_queue.sh "$D"  # test_efficientnet, the probes, swin, llama at 10m
summary=bench/results/tune_sweep_h200/summary.json
# every committed row, timed again beside every peer with the KV cache off (up to s42 per-layer
# compile recompiled per layer on the HF decoders and ran half of their layers eager): the HF
# decoders first, then the rows that lack the reduce-overhead peer
retime=$(python3 -c "
import json
rows = [r for r in json.load(open('$summary'))['rows'] if r['size'] == 'full' and r['budget_s'] == 180
        and '@' in r['model'] and r['model'] not in ('zoo@t5', 'zoo@swin')]
decoders = ('llama', 'mistral', 'qwen2', 'gemma', 'phi', 'mixtral', 'bloom', 'gpt2', 'nanogpt')
first = lambda r: (not r['model'].endswith(decoders), 'compile-model-ro' in r.get('peers', {}))
print(','.join(r['model'] for r in sorted(rows, key=first)))")
cp "$summary" "$D/retime_from.json"
RETIME="$D/retime_from.json" MODELS="$retime" SAMPLE= BUDGET=3m exec bash bench/gpu_call_tune_rows.sh "$D"
