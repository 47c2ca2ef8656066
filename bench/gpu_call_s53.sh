#!/usr/bin/env bash
# A device session of issue 33 after s52, polled with bench/gpu_poll.sh 280: the GPU tests of
# the looks (a baseline timed alone stops where its median is settled); the rows s52's changes
# are for, at 3m, each with the head-to-head: ministral3 (sides one at a time: per-block compile
# kept at once, float8 on it, the whole-model forms last in its place) and the zoo's mixtral
# (reduce-overhead compile beside compile-model on an MoE, never run in a row yet);
# test_efficientnet's row timed again in three rounds (how far one program's block moves between
# builds on a short step); then the zoo rows without a reduce-overhead peer
# (bench/gpu_call_s52.sh's), the convnets first, in two rounds; then stablelm (its peers were cut
# in s52) and glm_moe_dsa (a settled baseline: its eager steps of 1.2 s no longer timed 20 where
# 10 are paired); then the seeded sample's next three. On a machine of several GPUs the rows of
# each list are dealt over them.
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> bash bench/gpu_call_s53.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
bash bench/gpu_session_tests.sh "$D" 150 tests/ab/test_ab_gpu.py -k "look"
rows() {  # rows MODELS: each at 3m with every peer and the head-to-head (ROUNDS passed on)
    MODELS=$1 SAMPLE= BUDGET=3m ROW_TIMEOUT=1000 KEEP_GOING=1 bash bench/gpu_call_tune_rows.sh "$D"
}
rows arch@ministral3,zoo@mixtral
# test_efficientnet's s51 row (0.793 block-timed, 1.004 alternated) timed again without a
# search, its variants in three rounds (the order reversed every other round): how far one
# program's block moves between fresh builds on a 2-3 ms step (s52: 10-15% in one process,
# more than the stacks differ), and the row's figure over all three
RETIME=bench/results/tune_sweep_h100/summary.json ROUNDS=3 rows arch@timm:test_efficientnet
# the convnets' steps are short: their variants timed in two rounds (tune_sweep.py --rounds),
# where tune's compile-model and the reduce-overhead peer replay the same graphs
ROUNDS=2 rows zoo@resnet,zoo@convnext
rows zoo@bert,zoo@vit,zoo@qwen2,zoo@gemma,zoo@mistral,zoo@phi
rows arch@stablelm,arch@glm_moe_dsa
# the seeded sample's next architectures (--arch-sample 20:33 --list: gemma3's rows were cut,
# longcat_flash does not fit an H100, the ten before are measured)
rows arch@gemma3,arch@roberta-prelayernorm/causal-lm,arch@luke
echo done > "$D/DONE"
