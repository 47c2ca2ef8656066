#!/usr/bin/env bash
# The next device session (~30 minutes of device time), in order. In s66 this session's
# predecessor (bench/gpu_call_s66.sh, at f783213) got 361 s of an H100: the GPU tune tests
# passed (4) and inception_resnet_v2's 3m search selected the compile group's first fallback at
# 1.864x but could not confirm it in the time (bench/results/tune_sweep_h100/README.md, s66).
# Now:
# 0. every GPU test outside tests/zoo (the lever options are read and checked since 5c3715e and
#    772cb8f; last full run s65 at 1324b75: 60 of 61), into $D/t;
# 1. 3m: inception_resnet_v2 again, where the fallbacks now keep 45% of the time (cfcf3f7: 81 s,
#    for the blocks' selection and their confirmation, which s66's 72 s cut), its peers timed;
# 2. 10m, issue 33's default-budget goal (vs_best_peer >= 1.05 on half of the goal's models;
#    4 rows, all met): timm's convit_tiny, xlm's masked LM, ibert, the zoo's resnet, convnext;
# 3. glm_moe_dsa at 3m, its peers timed this time (s65's search kept compile-blocks at 1.378x).
# On a machine of several GPUs the models are dealt over them (bench/gpu_call_tune_rows.sh).
# Polled with bench/gpu_poll.sh without a pause between polls.
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> bash bench/gpu_call_s67.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
mkdir -p "$D/t/gpu_tests"
timeout 360 python -m pytest -q -p no:cacheprovider -n 4 -rfEs -m gpu tests --ignore=tests/zoo \
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
