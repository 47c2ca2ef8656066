#!/usr/bin/env bash
# A device session of issue 33 (background, polled by bench/gpu_poll.sh), for a 30-minute budget,
# as far as it goes: the GPU tests (compile-model's CUDA graphs without inductor on a BatchNorm
# convnet, then s46's three), then timm's inception_resnet_v2 at 3m (s46's miss: inductor's
# ~210 s compile ran past the budget; now stopped inside its step, with the CUDA-graph fallback
# tried in the time kept for it), beside the reduce-overhead peer only (the best at s46, 3.10x;
# each inductor peer compiles ~215 s), then the sampled architectures still without a row, then
# the rest of s46's list (test_efficientnet, the channels-last probe, swin, the max-autotune
# probe, llama at 10m, the retime).
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> bash bench/gpu_call_s47.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
bash bench/gpu_session_tests.sh "$D" 240 tests/zoo/test_compile_graphs_gpu.py tests/ab/test_ab_gpu.py \
    tests/tune/test_gpu_tune.py -k "cuda_graph_form or one_at_a_time or compiles_once or stops_its_timed_steps"
MODELS=arch@timm:inception_resnet_v2 PEERS=compile-model-ro SAMPLE= BUDGET=3m ROW_TIMEOUT=900 KEEP_GOING=1 \
    bash bench/gpu_call_tune_rows.sh "$D"
MODELS=arch@timm:hiera_tiny_224,arch@ibert,arch@gemma3,arch@glm_moe_dsa,arch@longcat_flash \
    SAMPLE= BUDGET=3m ROW_TIMEOUT=900 KEEP_GOING=1 bash bench/gpu_call_tune_rows.sh "$D"
bash bench/gpu_session_queue.sh "$D"  # test_efficientnet, the probes, swin, llama at 10m
echo done > "$D/DONE"
