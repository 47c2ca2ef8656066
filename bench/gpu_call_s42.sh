#!/usr/bin/env bash
# A device session of issue 33 (background, polled by bench/gpu_poll.sh), ordered for a 30-minute
# budget: the GPU tests changed after s40; autocast-bf16's parity on three fp32 BatchNorm convnets
# at batch 64; the zoo rows the goal table still lacks (MODELS, default timm-vit, swin, t5); then
# the committed rows that lack the reduce-overhead compile peer timed again beside every peer
# (bench/gpu_call_s41.sh's retime, no search), as far as the budget goes.
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> BUDGET=3m bash bench/gpu_call_s42.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
bash bench/gpu_session_tests.sh "$D" 180 tests/levers/test_levers_gpu.py tests/ab/test_ab_gpu.py -k "fused_loss or one_at_a_time"
mkdir -p "$D/b/bn_autocast"
for model in timm:rexnet_100 timm:mobilenetv3_large_100 resnet; do
    timeout 150 python -m levers.cli ab arch --set model=$model size=full batch_size=64 device=cuda \
        --lever autocast-bf16 --steps 10 --warmup 2 --json "$D/b/bn_autocast/${model#timm:}.json" \
        > "$D/b/bn_autocast/${model#timm:}.log" 2>&1
done
(cd "$D/b" && tar -czf round.tgz bn_autocast)
MODELS="${MODELS:-zoo@timm-vit,zoo@swin,zoo@t5}" SAMPLE= KEEP_GOING=1 bash bench/gpu_call_tune_rows.sh "$D"
summary=bench/results/tune_sweep_h200/summary.json
lacking=$(python3 -c "
import json
rows = json.load(open('$summary'))['rows']
lacking = [r for r in rows if r['size'] == 'full' and r['budget_s'] == 180
           and 'compile-model-ro' not in r.get('peers', {})]
first = lambda r: (r['stack'][:1] != ['compile-model'], not (r['stack'] or [''])[0].startswith('compile-model'))
print(','.join(r['model'] for r in sorted(lacking, key=first)))")
cp "$summary" "$D/retime_from.json"
RETIME="$D/retime_from.json" MODELS="$lacking" SAMPLE= exec bash bench/gpu_call_tune_rows.sh "$D"
