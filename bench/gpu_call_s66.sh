#!/usr/bin/env bash
# The next device session (s65 got no machine; ~30 minutes of device time), in order:
# 0. first, the GPU tests (none ran in s62-s64): all but the zoo's float64 references, four
#    pytest-xdist workers on the one GPU (its wheel in .whl/), at most 360 s, into $D/t.
# 1. timm's inception_resnet_v2 (issue 33's 3m miss, 0.345 on the H100 in s64: only inductor's
#    kernels under CUDA graphs pay there, 3.97x, and the whole model's compile takes ~210 s):
#    compile-blocks:mode=reduce-overhead, per-block programs replayed as CUDA graphs (3 programs
#    for its 39 blocks), timed beside whole-model reduce-overhead compile, each's warm-up (its
#    compile) recorded (bench/retime_inception_blocks_ro.json; tune_sweep.py --retime): not a
#    goal row, kept in $D/i0, apart from the rows after it;
# 3. 10m, issue 33's default-budget goal (vs_best_peer >= 1.05 on half of the goal's models;
#    s64: 4 rows, all met, squeezebert's 1.068 the latest), the rows most likely to meet it:
#    xlm's masked LM (its 3m search kept one compile form; loss-valid-rows, 1.07x on
#    squeezebert's and 1.18x on luke's CUDA graphs, comes after it; s64 cut its row in its
#    second A/B), timm's convit_tiny (1.087 at 3m), ibert (its 10m row, 1.110, predates
#    loss-valid-rows on masked LMs), the zoo's resnet and convnext (channels-last and the
#    autotuned form on CUDA graphs);
# 2. 3m: glm_moe_dsa (its row predates the settled-baseline stop of sides one at a time); before
#    the 10m rows, which take ~15 minutes each, where the session has ~22 minutes left.
# On a machine of several GPUs the models are dealt over them (bench/gpu_call_tune_rows.sh).
# Polled with bench/gpu_poll.sh without a pause between polls.
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> bash bench/gpu_call_s66.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
mkdir -p "$D/t/gpu_tests"
timeout 360 python -m pytest -q -p no:cacheprovider -n 4 -rfEs -m gpu tests --ignore=tests/zoo \
    > "$D/t/gpu_tests/pytest.log" 2>&1
echo "rc=$?" >> "$D/t/gpu_tests/pytest.log"
(cd "$D/t" && tar -czf round.tgz gpu_tests)
RETIME=bench/retime_inception_blocks_ro.json PEERS=compile-model-ro \
    MODELS=arch@timm:inception_resnet_v2 SAMPLE= BUDGET=3m ROW_TIMEOUT=600 KEEP_GOING=1 \
    bash bench/gpu_call_tune_rows.sh "$D"
# not a goal row (no search): kept apart from the rows after it, in $D/i0 (i0.tgz)
mv "$D/a0" "$D/i0"; mv "$D/a0.out" "$D/i0.out"
MODELS=arch@glm_moe_dsa SAMPLE= BUDGET=3m ROW_TIMEOUT=900 KEEP_GOING=1 \
    bash bench/gpu_call_tune_rows.sh "$D"
MODELS=arch@xlm/masked-lm,arch@timm:convit_tiny,arch@ibert,zoo@resnet,zoo@convnext \
    SAMPLE= BUDGET=10m ROW_TIMEOUT=1200 KEEP_GOING=1 bash bench/gpu_call_tune_rows.sh "$D"
echo done > "$D/DONE"
