#!/usr/bin/env bash
# A device session of issue 33 after bench/gpu_call_s51.sh: the zoo's rows that have no
# reduce-overhead peer yet (their H200 rows, b407994 to 48cb42f, timed model.compile() in its
# default mode only), run afresh at 3m with the current tune and every peer of
# bench/tune_sweep.py, each with the head-to-head. The convnets first (their rows read 1.47x
# and 1.94x above model.compile() because tune's compile-model replays CUDA graphs and that
# peer did not), then the transformers. Poll with bench/gpu_poll.sh 280.
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> bash bench/gpu_call_s52.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
MODELS=zoo@resnet,zoo@convnext,zoo@bert,zoo@vit,zoo@qwen2,zoo@gemma,zoo@mistral,zoo@phi SAMPLE= \
    BUDGET=3m ROW_TIMEOUT=900 KEEP_GOING=1 bash bench/gpu_call_tune_rows.sh "$D"
echo done > "$D/DONE"
