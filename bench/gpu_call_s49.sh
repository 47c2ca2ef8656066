#!/usr/bin/env bash
# A device session of issue 33 (background, polled by bench/gpu_poll.sh), s48's list reordered for
# a session whose machine came late (~20 minutes of device time left): the GPU tests (channels-last
# alone and under compile-model's CUDA graphs, then s46's three), then whether inductor gains or
# loses on top of channels-last (tune now tries channels-last first on a convnet, compile on top),
# then compile-blocks on s47's inception_resnet_v2 miss (it applies there since s49), then the
# sampled architectures still without a 3m row, then channels-last on inception_resnet_v2 without
# inductor (minutes), inception_resnet_v2 at 3m, then the rest.
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> bash bench/gpu_call_s49.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
source bench/gpu_session_probe.sh  # probe LETTER FOLDER TIMEOUT_S MODELS STACKS
bash bench/gpu_session_tests.sh "$D" 300 tests/zoo/test_compile_graphs_gpu.py tests/ab/test_ab_gpu.py \
    tests/tune/test_gpu_tune.py -k "cuda_graph_form or channels_last or one_at_a_time or compiles_once or stops_its_timed_steps"
probe c channels_last_probe 300 zoo@resnet,zoo@convnext,arch@timm:test_efficientnet \
    "compile-model;channels-last+compile-model;channels-last"
# compile-blocks on inception_resnet_v2 since it leaves its branches' single ConvNormActs eager
# (3 programs, not 17): its compile time and speed beside whole-model compile's 210 s
probe b blocks_probe 420 arch@timm:inception_resnet_v2 "compile-blocks;channels-last+compile-blocks"
MODELS=arch@ibert,arch@timm:hiera_tiny_224,arch@glm_moe_dsa,arch@gemma3,arch@longcat_flash \
    SAMPLE= BUDGET=3m ROW_TIMEOUT=900 KEEP_GOING=1 bash bench/gpu_call_tune_rows.sh "$D"
mkdir -p "$D/g/cudagraphs_probe"
timeout 240 python bench/cudagraphs_probe.py --models arch@timm:inception_resnet_v2 \
    --stacks "channels-last;compile-model:backend=cudagraphs;channels-last+compile-model:backend=cudagraphs" \
    --out "$D/g/cudagraphs_probe" > "$D/g.out" 2>&1
cp "$D/g.out" "$D/g/cudagraphs_probe/session.log"; (cd "$D/g" && tar -czf round.tgz cudagraphs_probe)
MODELS=arch@timm:inception_resnet_v2 PEERS=compile-model-ro SAMPLE= BUDGET=3m ROW_TIMEOUT=900 KEEP_GOING=1 \
    bash bench/gpu_call_tune_rows.sh "$D"
QUEUE_SKIP=c bash bench/gpu_session_queue.sh "$D"  # test_efficientnet, swin, the max-autotune probe, llama at 10m
echo done > "$D/DONE"
