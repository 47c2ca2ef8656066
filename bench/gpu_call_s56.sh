#!/usr/bin/env bash
# A device session of issue 33 after s55, polled with bench/gpu_poll.sh 280. First why float8 did
# not pay in tune's A/B on the zoo's mistral and phi (s55: float8 on per-block compile 0.994x and
# 1.000x, where torchtitan's recipe, the same torchao and filter on per-layer compile, ran 1.088x
# and 1.030x over per-layer compile in the same process): each form built fresh and timed alone
# with its kernels by name (levers' float8 applied after and before compile-blocks, torchtitan's
# conversion, per-layer compile alone), then tune's A/B of float8 on compile-blocks as tune times
# it and compiled again as the user runs it, then levers' float8 stack and the recipe once more
# after those A/Bs (their float64 reference does not fit the H100: what it leaves). mistral's probe
# first, then swin's row timed again beside the whole-model compile peers with its head to head
# (s55 cut it in the per-layer compile peer), then phi's probe, the GPU test of the autotuned
# compile form (pending since s54) and the default budget's first row (ibert at 10m).
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> bash bench/gpu_call_s56.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
P="$D/p/tune_sweep_h200"
mkdir -p "$P"
probe() {
    timeout 540 python bench/cudagraphs_probe.py --models "zoo@$1" --warmup 4 --steps 15 \
        --stacks "compile-blocks;compile-blocks+float8;float8+compile-blocks;peer:compile-layers;peer:float8-torchtitan+compile-layers" \
        --ab "compile-blocks>compile-blocks+float8" \
        --stacks-after "compile-blocks+float8;peer:float8-torchtitan+compile-layers" \
        --out "$P/float8_probe_$1" > "$P/float8_probe_$1.log" 2>&1
}
probe mistral
# swin: tune's 3m stack of s55 (compile-model) timed again beside the two whole-model compile
# peers and head to head with the best, no search. The per-layer compile peers are left out: on
# swin they recompiled with dynamic shapes past the row's timeout on the H200 and on the H100
MODELS=zoo@swin SAMPLE= BUDGET=3m ROW_TIMEOUT=420 KEEP_GOING=1 PEERS=compile-model,compile-model-ro \
    RETIME=bench/results/tune_sweep_h100/summary.json bash bench/gpu_call_tune_rows.sh "$D"
probe phi
bash bench/gpu_session_tests.sh "$D" 300 tests/zoo/test_compile_graphs_gpu.py -k autotuned
MODELS=arch@ibert SAMPLE= BUDGET=10m ROW_TIMEOUT=1320 KEEP_GOING=1 \
    bash bench/gpu_call_tune_rows.sh "$D"
echo done > "$D/DONE"
