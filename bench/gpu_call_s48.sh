#!/usr/bin/env bash
# A device session of issue 33 (background, polled by bench/gpu_poll.sh), for a 30-minute budget,
# as far as it goes: the GPU tests (compile-model's CUDA graphs without inductor, channels-last
# alone and under them, then s46's three), then the probe of s47's inception_resnet_v2 miss
# (eager against the CUDA-graph form and channels-last on four convnets, with dynamo's counters
# and one profiled step: were the graphs captured, is eager bound by its kernels or their
# launches; no inductor, minutes), then inception_resnet_v2 at 3m beside the reduce-overhead
# peer (tune now tries channels-last first on a convnet), then the sampled architectures still
# without a row, then the rest of s46's list (bench/gpu_session_queue.sh).
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> bash bench/gpu_call_s48.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
source bench/gpu_session_probe.sh  # probe LETTER FOLDER TIMEOUT_S MODELS STACKS
bash bench/gpu_session_tests.sh "$D" 300 tests/zoo/test_compile_graphs_gpu.py tests/ab/test_ab_gpu.py \
    tests/tune/test_gpu_tune.py -k "cuda_graph_form or channels_last or one_at_a_time or compiles_once or stops_its_timed_steps"
mkdir -p "$D/g/cudagraphs_probe"
timeout 420 python bench/cudagraphs_probe.py \
    --models arch@timm:inception_resnet_v2,zoo@resnet,zoo@convnext,arch@timm:test_efficientnet \
    --stacks "compile-model:backend=cudagraphs;channels-last;channels-last+compile-model:backend=cudagraphs" \
    --out "$D/g/cudagraphs_probe" > "$D/g.out" 2>&1
cp "$D/g.out" "$D/g/cudagraphs_probe/session.log"; (cd "$D/g" && tar -czf round.tgz cudagraphs_probe)
# the queue's channels-last probe, early: tune now tries channels-last before compile on a
# convnet, so whether inductor gains or loses on top of it decides the convnet rows
probe c channels_last_probe 300 zoo@resnet,zoo@convnext,arch@timm:test_efficientnet \
    "compile-model;channels-last+compile-model;channels-last"
MODELS=arch@timm:inception_resnet_v2 PEERS=compile-model-ro SAMPLE= BUDGET=3m ROW_TIMEOUT=900 KEEP_GOING=1 \
    bash bench/gpu_call_tune_rows.sh "$D"
MODELS=arch@timm:hiera_tiny_224,arch@ibert,arch@glm_moe_dsa,arch@gemma3,arch@longcat_flash \
    SAMPLE= BUDGET=3m ROW_TIMEOUT=900 KEEP_GOING=1 bash bench/gpu_call_tune_rows.sh "$D"
QUEUE_SKIP=c bash bench/gpu_session_queue.sh "$D"  # test_efficientnet, swin, the max-autotune probe, llama at 10m
echo done > "$D/DONE"
