#!/usr/bin/env bash
# A device session of issue 33 after s59 (an H100 wanted: the goal table's GPU), polled with
# bench/gpu_poll.sh 280 without a pause between polls (a machine goes back 30 s after a call).
# 1. bert's 10m row again (since e4e31e2 loss-valid-rows applies to a masked LM: the output
#    projection on the masked tokens only, ~15% of them, a lever no peer has); then compile-loss
#    (the HF loss compiled, as torchtitan does beside its blocks) probed on mistral, on tune's
#    stack and on torchtitan's recipe, and its GPU test; then the 10m rows of luke and ibert (masked LMs too);
# 2. a probe of s59's bert row (tune's per-block compile 55.1 ms a step, the per-layer peer
#    51.4 ms, the same graph as dynamo captures it on the CPU): each form built fresh twice, in
#    turn, with its GPU kernel time and top kernels, and the lever on per-block compile;
# 3. the autotuned forms' GPU test on gpt2 (both forms; since 1a81b83 it also checks that
#    inductor's autotuning tables stay off the terminal);
# 4. the 10m rows of the zoo's mistral and phi (s59's mistral row was cut while its autotuned
#    blocks compiled).
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> bash bench/gpu_call_s60.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
MODELS=zoo@bert SAMPLE= BUDGET=10m ROW_TIMEOUT=1320 KEEP_GOING=1 \
    bash bench/gpu_call_tune_rows.sh "$D"
mkdir -p "$D/p"
timeout 420 python bench/cudagraphs_probe.py --models zoo@mistral \
    --stacks "compile-blocks+float8;compile-blocks+float8+compile-loss;peer:float8-torchtitan+compile-layers;peer:float8-torchtitan+compile-layers+compile-loss;compile-blocks+float8+compile-loss" \
    --steps 30 --out "$D/p/mistral_loss_probe" > "$D/p/mistral_loss_probe.log" 2>&1
(cd "$D/p" && tar -czf round.tgz mistral_loss_probe mistral_loss_probe.log)
mkdir -p "$D/c/gpu_tests"  # its own folder: the gpt2 test below writes $D/t's
timeout 240 python -m pytest -q -p no:cacheprovider -rfEs -m gpu tests/levers/test_levers_gpu.py \
    -k compile_loss > "$D/c/gpu_tests/pytest.log" 2>&1
echo "rc=$?" >> "$D/c/gpu_tests/pytest.log"
(cd "$D/c" && tar -czf round.tgz gpu_tests)
MODELS=arch@luke,arch@ibert SAMPLE= BUDGET=10m ROW_TIMEOUT=1320 KEEP_GOING=1 \
    bash bench/gpu_call_tune_rows.sh "$D"
timeout 300 python bench/cudagraphs_probe.py --models zoo@bert \
    --stacks "compile-blocks;peer:compile-layers;compile-blocks;peer:compile-layers;compile-blocks+loss-valid-rows" \
    --steps 30 --out "$D/p/bert_blocks_probe" > "$D/p/bert_blocks_probe.log" 2>&1
(cd "$D/p" && tar -czf round.tgz mistral_loss_probe mistral_loss_probe.log bert_blocks_probe bert_blocks_probe.log)
bash bench/gpu_session_tests.sh "$D" 240 tests/zoo/test_compile_graphs_gpu.py \
    -k "autotuned and gpt2"
MODELS=zoo@mistral,zoo@phi SAMPLE= BUDGET=10m ROW_TIMEOUT=1320 KEEP_GOING=1 \
    bash bench/gpu_call_tune_rows.sh "$D"
echo done > "$D/DONE"
