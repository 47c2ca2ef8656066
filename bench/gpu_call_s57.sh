#!/usr/bin/env bash
# A device session of issue 33 after s56, polled with bench/gpu_poll.sh 280: the default budget's
# rows (10m) of the decoder LLMs where tune has levers beyond the peers' to stack (float8 on a
# whole-model compile, where torchtitan's recipe puts it on per-layer compile): stablelm (s54 at
# 3m: per-block compile + float8, 0.999 of torchtitan's float8) and ministral3 (s53 at 3m:
# per-block compile + float8 proven 1.42x; the whole-model compile in its place confirmed 1.050x,
# its stack's proof cut by the budget), then the zoo's llama (1.035 at 3m).
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> bash bench/gpu_call_s57.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
MODELS=arch@stablelm,arch@ministral3,zoo@llama SAMPLE= BUDGET=10m ROW_TIMEOUT=1320 \
    KEEP_GOING=1 bash bench/gpu_call_tune_rows.sh "$D"
echo done > "$D/DONE"
