#!/usr/bin/env bash
# The next device session's job (background, polled by bench/gpu_poll.sh): the GPU test changed
# after s40, then the goal rows. Until s40 the goal
# rows' calls passed --peers without compile-model-ro (reduce-overhead whole-model compile), the
# peer closest to tune's own compile-model (which uses CUDA graphs where they pay), so their
# vs_best_peer is against the best of the other peers. First the committed rows that lack it are
# timed again beside every peer, stack as searched (tune_sweep.py --retime, no search: ~2 min a
# model; those whose stack is CUDA-graph compile-model first); then new rows of MODELS (default: the zoo models not yet reached).
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> BUDGET=3m bash bench/gpu_call_s41.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
# the GPU tests changed after s40 (the fused loss's regime with Liger's kernel; ab's sides one at a time) into $D/t
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
bash bench/gpu_session_tests.sh "$D" 180 tests/levers/test_levers_gpu.py tests/ab/test_ab_gpu.py -k "fused_loss or one_at_a_time"
# autocast-bf16's parity on fp32 convnets with BatchNorm at a realistic shape (the CPU arch sweep
# read it DAMAGED at batch 2; bench/results/parity_sensitivity_cpu): levers ab, one per model, into $D/b
mkdir -p "$D/b/bn_autocast"
for model in timm:rexnet_100 timm:mobilenetv3_large_100 resnet; do
    timeout 150 python -m levers.cli ab arch --set model=$model size=full batch_size=64 device=cuda \
        --lever autocast-bf16 --steps 10 --warmup 2 --json "$D/b/bn_autocast/${model#timm:}.json" \
        > "$D/b/bn_autocast/${model#timm:}.log" 2>&1
done
(cd "$D/b" && tar -czf round.tgz bn_autocast)
summary=bench/results/tune_sweep_h200/summary.json
lacking=$(python3 -c "
import json
rows = json.load(open('$summary'))['rows']
lacking = [r for r in rows if r['size'] == 'full' and r['budget_s'] == 180
           and 'compile-model-ro' not in r.get('peers', {})]
# first the rows whose stack holds tune's CUDA-graph compile-model, the peer's own form
first = lambda r: (r['stack'][:1] != ['compile-model'], not (r['stack'] or [''])[0].startswith('compile-model'))
print(','.join(r['model'] for r in sorted(lacking, key=first)))")
cp "$summary" "$D/retime_from.json"
RETIME="$D/retime_from.json" MODELS="${RETIME_MODELS:-$lacking}" SAMPLE= KEEP_GOING=1 \
    bash bench/gpu_call_tune_rows.sh "$D"
MODELS="${MODELS:-zoo@timm-vit,zoo@swin,zoo@t5}" exec bash bench/gpu_call_tune_rows.sh "$D"
