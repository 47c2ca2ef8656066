#!/usr/bin/env bash
# A device session of issue 33 after s51 (background, polled by bench/gpu_poll.sh 280): the GPU
# tests of this stop (reduce-overhead compile on an MoE; ab's looks); two probes of how to read
# a row whose stack and best peer both replay CUDA graphs (levers' reduce-overhead compile
# against the peer's in blocks; alternation against blocks); then the rows s51's changes are
# for, each with the head-to-head: timm's convit_tiny (its CUDA graphs fail: the default mode
# next, not the fallback), ministral3 (float8-rowwise no longer runs into the proof's time),
# glm_moe_dsa (no experts' cast first; per-block compile first where the sides run one at a
# time), ibert (CUDA graphs fail there too), stablelm (its peers were cut in s51); the zoo's
# mixtral (reduce-overhead beside compile-model on an MoE; Liger not tried after compile paid);
# gemma3 and two more sampled; ministral3 at the default budget.
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> bash bench/gpu_call_s51.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
source bench/gpu_session_probe.sh  # probe LETTER FOLDER TIMEOUT_S MODELS STACKS
bash bench/gpu_session_tests.sh "$D" 150 tests/zoo/test_compile_graphs_gpu.py \
    tests/ab/test_ab_gpu.py -k "mixture or look"
# first, how to read a row whose stack and best peer both replay CUDA graphs (minutes):
# levers' reduce-overhead compile against the peer's, block-timed as the sweep times them: s51's
# test_efficientnet row read tune's stack at 3.5 ms a step against the peer's 2.8 ms in their
# blocks, and the two level (3.6 ms each) alternated step by step
probe r ro_probe 240 arch@timm:test_efficientnet \
    "peer:compile-model-ro;compile-model;compile-model+channels-last"
# and whether alternating two CUDA-graph programs step by step (ab's A/Bs, the head-to-head)
# times them as their own blocks do: blocks, alternated, windows of 10, in one process
mkdir -p "$D/w/alternation_probe"
timeout 240 python bench/alternation_probe.py --models arch@timm:test_efficientnet \
    --pairs "compile-model;compile-model+channels-last|peer:compile-model-ro;compile-model+channels-last" \
    --out "$D/w/alternation_probe" > "$D/w.out" 2>&1
cp "$D/w.out" "$D/w/alternation_probe/session.log"; (cd "$D/w" && tar -czf round.tgz alternation_probe)
# the sampled architectures first (the goal's eight), then the zoo's mixtral
MODELS=arch@timm:convit_tiny,arch@ministral3,arch@glm_moe_dsa,arch@ibert,arch@stablelm SAMPLE= \
    BUDGET=3m ROW_TIMEOUT=900 KEEP_GOING=1 bash bench/gpu_call_tune_rows.sh "$D"
MODELS=zoo@mixtral,arch@gemma3,arch@roberta-prelayernorm/causal-lm,arch@luke SAMPLE= BUDGET=3m \
    ROW_TIMEOUT=900 KEEP_GOING=1 bash bench/gpu_call_tune_rows.sh "$D"
# a default-budget row (none yet) where tune has levers beyond the peers' to stack: ministral3's
# 131k vocabulary is outside the fused loss's measured-slower regime (its 3m row ran out of
# time before it)
MODELS=arch@ministral3 SAMPLE= BUDGET=10m ROW_TIMEOUT=1320 KEEP_GOING=1 bash bench/gpu_call_tune_rows.sh "$D"
echo done > "$D/DONE"
