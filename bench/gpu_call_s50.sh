#!/usr/bin/env bash
# A device session of issue 33 after s50 (background, polled by bench/gpu_poll.sh 280): ab's GPU
# tests of the interim looks (sides one at a time since s50); the MoE rows, glm_moe_dsa (s50:
# nothing kept, whole-model compile unconfirmed) and the zoo's mixtral, where tune now casts the
# experts to bf16 before it tries the compile forms; test_efficientnet's again, since tune tries
# channels-last after the compile forms (s45's 0.951 was channels-last kept first, compile on
# top); the next architectures of the seeded sample (SAMPLE=14:33 lists them after s46's eight;
# longcat_flash does not fit an H100); ibert's row timed again, head to head; gemma3 (its s50 row
# was cut by the session's end); a default-budget row (none yet); two more sampled.
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> bash bench/gpu_call_s50.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
bash bench/gpu_session_tests.sh "$D" 120 tests/ab/test_ab_gpu.py -k "look"
# the MoE rows first: tune tries the experts' cast to bf16 before the compile forms since s50
MODELS=arch@glm_moe_dsa,zoo@mixtral SAMPLE= BUDGET=3m ROW_TIMEOUT=900 KEEP_GOING=1 bash bench/gpu_call_tune_rows.sh "$D"
MODELS=arch@timm:test_efficientnet,arch@xlm/masked-lm,arch@timm:convit_tiny,arch@ministral3,arch@stablelm \
    SAMPLE= BUDGET=3m ROW_TIMEOUT=900 KEEP_GOING=1 bash bench/gpu_call_tune_rows.sh "$D"
# ibert's s50 row (0.959: its stack is model.compile()'s program, timed in another block) timed
# again beside the peers, with the stack and the best peer head to head (no search)
RETIME=bench/results/tune_sweep_h100/summary.json MODELS=arch@ibert SAMPLE= BUDGET=3m ROW_TIMEOUT=600 \
    KEEP_GOING=1 bash bench/gpu_call_tune_rows.sh "$D"
MODELS=arch@gemma3 SAMPLE= BUDGET=3m ROW_TIMEOUT=900 KEEP_GOING=1 bash bench/gpu_call_tune_rows.sh "$D"
MODELS=zoo@gpt2 SAMPLE= BUDGET=10m ROW_TIMEOUT=1320 KEEP_GOING=1 bash bench/gpu_call_tune_rows.sh "$D"
MODELS=arch@roberta-prelayernorm/causal-lm,arch@luke SAMPLE= BUDGET=3m ROW_TIMEOUT=900 KEEP_GOING=1 \
    bash bench/gpu_call_tune_rows.sh "$D"
echo done > "$D/DONE"
