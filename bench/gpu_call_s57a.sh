#!/usr/bin/env bash
# A device session of issue 33 after s56 (an H100 wanted: the goal table's GPU), polled with
# bench/gpu_poll.sh 270. s56 measured on an H200 that levers' float8 stack is torchtitan's program
# and that tune's A/B of float8 on per-block compile pays there (mistral 1.065x, phi 1.021x), where
# s55's searches on the H100 read 0.994x and 1.000x. The same probes on the H100, built fresh in
# one process, with what the process holds on the device before and after each A/B (its float64
# reference does not fit the H100: whether what it leaves crowds the sides into allocator
# retries): mistral, then phi, then the autotuned compile form's GPU test (pending since s54).
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> bash bench/gpu_call_s57a.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
P="$D/p/tune_sweep_h200"
mkdir -p "$P"
probe() {
    timeout 540 python bench/cudagraphs_probe.py --models "zoo@$1" --warmup 4 --steps 15 \
        --stacks "compile-blocks;compile-blocks+float8;peer:compile-layers;peer:float8-torchtitan+compile-layers" \
        --ab "compile-blocks>compile-blocks+float8" \
        --stacks-after "compile-blocks+float8;peer:float8-torchtitan+compile-layers" \
        --out "$P/float8_probe_$1" > "$P/float8_probe_$1.log" 2>&1
}
probe mistral
probe phi
bash bench/gpu_session_tests.sh "$D" 300 tests/zoo/test_compile_graphs_gpu.py -k autotuned
echo done > "$D/DONE"
