#!/usr/bin/env bash
# A device session of issue 33 after s54, polled with bench/gpu_poll.sh 280. First the 3m rows the
# goal table still lacks or missed, each a full search on this GPU (s54: a stack searched on an
# H200 and timed on an H100 is not the answer there, vit 0.804): luke (s54: 0.961, reduce-overhead
# compile timed on fallback_random programs; 76534c0 compiles a CUDA-graph side again for its
# timed steps), then the zoo's vit (and dynamo's counters of its compile forms), mistral, phi
# (their rows, of an H200, lack the reduce-overhead peer) and swin (cut in s42). Then the default
# budget's goal (vs_best_peer >= 1.05 on at least half of the models at 10m; no such row yet),
# cheapest first: the models where tune's 3m stack read >= 1.05 of the best peer (ibert 1.144 and
# convit_tiny 1.087 in s52; bert 1.071 in s54). At 10m tune also tries whole-model compile with
# inductor's autotuning last, in place of the compile form kept (LATE_FORMS): these rows are its
# first measurement. The GPU test of that form runs between the two.
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> bash bench/gpu_call_s55.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
rows() {  # rows MODELS: each at 3m with every peer and the head-to-head
    MODELS=$1 SAMPLE= BUDGET=3m ROW_TIMEOUT=1000 KEEP_GOING=1 bash bench/gpu_call_tune_rows.sh "$D"
}
rows arch@luke,zoo@vit
# vit on the H100 (s54): eager 371k tokens/s, model.compile() 358k, reduce-overhead 376k, where
# per-layer compile ran 466k: dynamo's graphs, breaks, recompiles and CUDA-graph skips of each
# compile form, packed with the rows
mkdir -p "$D/a0/tune_sweep_h200"
timeout 300 python bench/cudagraphs_probe.py --models zoo@vit \
    --stacks "compile-model:mode=default;compile-model;compile-blocks" \
    --out "$D/a0/tune_sweep_h200/vit_probe" > "$D/a0/tune_sweep_h200/vit_probe.log" 2>&1
rows zoo@mistral,zoo@phi,zoo@swin
bash bench/gpu_session_tests.sh "$D" 300 tests/zoo/test_compile_graphs_gpu.py -k autotuned
MODELS=arch@ibert,arch@timm:convit_tiny,zoo@bert SAMPLE= BUDGET=10m ROW_TIMEOUT=1320 \
    KEEP_GOING=1 bash bench/gpu_call_tune_rows.sh "$D"
echo done > "$D/DONE"
