#!/usr/bin/env bash
# The next device session (~30 minutes of device time), in order. In s65 this script, at
# 1324b75, ran the GPU tests, timed compile-blocks:mode=reduce-overhead on inception_resnet_v2
# (1.871x eager after a 27 s warm-up; bench/results/tune_sweep_h100/README.md, s65) and
# glm_moe_dsa's 3m search, whose peers the time cut. Now:
# 0. tests/tune/test_gpu_tune.py, whose dropout test s65 found stale and which was updated
#    (not yet run on a GPU), into $D/t;
# 1. 3m: timm's inception_resnet_v2 through tune, with the blocks' CUDA graphs now the compile
#    group's first fallback (s64's row: 0.345, the kernels-as-graphs fallback kept at 1.173x);
# 2. 10m, issue 33's default-budget goal (vs_best_peer >= 1.05 on half of the goal's models;
#    4 rows, all met): timm's convit_tiny, xlm's masked LM, ibert, the zoo's resnet, convnext;
# 3. glm_moe_dsa at 3m again, its peers timed this time (s65's search kept compile-blocks at 1.378x).
# On a machine of several GPUs the models are dealt over them (bench/gpu_call_tune_rows.sh).
# Polled with bench/gpu_poll.sh without a pause between polls.
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> bash bench/gpu_call_s66.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
mkdir -p "$D/t/gpu_tests"
timeout 300 python -m pytest -q -p no:cacheprovider -n 4 -rfEs -m gpu tests/tune/test_gpu_tune.py \
    > "$D/t/gpu_tests/pytest.log" 2>&1
echo "rc=$?" >> "$D/t/gpu_tests/pytest.log"
(cd "$D/t" && tar -czf round.tgz gpu_tests)
MODELS=arch@timm:inception_resnet_v2 SAMPLE= BUDGET=3m ROW_TIMEOUT=900 \
    KEEP_GOING=1 bash bench/gpu_call_tune_rows.sh "$D"
MODELS=arch@timm:convit_tiny,arch@xlm/masked-lm,arch@ibert,zoo@resnet,zoo@convnext \
    SAMPLE= BUDGET=10m ROW_TIMEOUT=1200 KEEP_GOING=1 bash bench/gpu_call_tune_rows.sh "$D"
MODELS=arch@glm_moe_dsa SAMPLE= BUDGET=3m ROW_TIMEOUT=900 \
    KEEP_GOING=1 bash bench/gpu_call_tune_rows.sh "$D"
echo done > "$D/DONE"
