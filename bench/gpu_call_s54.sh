#!/usr/bin/env bash
# A device session of issue 33 for its default-budget goal (vs_best_peer >= 1.05 on at least half
# of the models at 10m; no such row yet), polled with bench/gpu_poll.sh 280: two decoder LLMs
# where tune has levers beyond the peers' to stack (float8 on a whole-model compile, where
# torchtitan's recipe puts it on per-layer compile): ministral3 (s52 at 3m: compile 1.36x, float8
# 1.10x on top confirmed but never proven; sides one at a time) and stablelm (s52 at 3m:
# per-block compile + float8 proven 1.37x). Each row ~13 minutes: the budget, then every peer.
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> bash bench/gpu_call_s54.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
MODELS=arch@ministral3,arch@stablelm SAMPLE= BUDGET=10m ROW_TIMEOUT=1320 KEEP_GOING=1 \
    bash bench/gpu_call_tune_rows.sh "$D"
echo done > "$D/DONE"
