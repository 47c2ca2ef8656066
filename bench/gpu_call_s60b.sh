#!/usr/bin/env bash
# s60's device session cut to what ~6 minutes of device time hold (the session's other 24 went to
# machines that did not start): the two new levers measured on the step in one process each,
# before any tune row. Polled with bench/gpu_poll.sh 280 without a pause between polls.
# 1. bert (the zoo's, 32 x 512): per-block compile, the same with loss-valid-rows (the masked
#    LM's projection on the ~15% of tokens with a target, e4e31e2), the per-layer compile peer;
# 2. mistral (the zoo's, 4 x 2048, 32k vocabulary): tune's stack (per-block compile, float8)
#    with and without compile-loss, torchtitan's recipe with its compiled loss;
# 3. compile-loss's GPU test; 4. bert's 10m row, if time is left.
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> bash bench/gpu_call_s60b.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
mkdir -p "$D/p"
timeout 240 python bench/cudagraphs_probe.py --models zoo@bert \
    --stacks "compile-blocks;compile-blocks+loss-valid-rows;peer:compile-layers" \
    --steps 30 --out "$D/p/bert_mlm_probe" > "$D/p/bert_mlm_probe.log" 2>&1
(cd "$D/p" && tar -czf round.tgz bert_mlm_probe bert_mlm_probe.log)
timeout 300 python bench/cudagraphs_probe.py --models zoo@mistral \
    --stacks "compile-blocks+float8;compile-blocks+float8+compile-loss;peer:float8-torchtitan+compile-layers+compile-loss" \
    --steps 30 --out "$D/p/mistral_loss_probe" > "$D/p/mistral_loss_probe.log" 2>&1
(cd "$D/p" && tar -czf round.tgz bert_mlm_probe bert_mlm_probe.log mistral_loss_probe \
    mistral_loss_probe.log)
mkdir -p "$D/c/gpu_tests"
timeout 240 python -m pytest -q -p no:cacheprovider -rfEs -m gpu tests/levers/test_levers_gpu.py \
    -k compile_loss > "$D/c/gpu_tests/pytest.log" 2>&1
echo "rc=$?" >> "$D/c/gpu_tests/pytest.log"
(cd "$D/c" && tar -czf round.tgz gpu_tests)
MODELS=zoo@bert SAMPLE= BUDGET=10m ROW_TIMEOUT=1320 KEEP_GOING=1 \
    bash bench/gpu_call_tune_rows.sh "$D"
echo done > "$D/DONE"
