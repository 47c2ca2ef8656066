#!/usr/bin/env bash
# A device session of issue 33 for its default-budget goal (vs_best_peer >= 1.05 on at least half
# of the models at 10m; no such row yet), polled with bench/gpu_poll.sh 280. A search that runs
# out of candidates ends before its budget (the zoo's mixtral at 3m: 92 s), so the rows go
# cheapest first: the models where tune's 3m stack already read >= 1.05 of the best peer
# (ibert 1.144 and convit_tiny 1.087 in s52; bert 1.248 in s53, its peers incomplete), then two
# decoder LLMs where tune has levers beyond the peers' to stack (float8 on a whole-model compile,
# where torchtitan's recipe puts it on per-layer compile): stablelm (s52 at 3m: per-block compile
# + float8 proven 1.37x) and ministral3 (s53 at 3m: per-block compile + float8 proven 1.42x; the
# whole-model compile in its place confirmed 1.050x, its stack's proof cut by the budget). At
# this budget tune also tries whole-model compile with inductor's autotuning last, in place of
# the compile form kept (LATE_FORMS): these rows are its first measurement.
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> bash bench/gpu_call_s55.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
MODELS=arch@ibert,arch@timm:convit_tiny,zoo@bert,arch@stablelm,arch@ministral3 SAMPLE= \
    BUDGET=10m ROW_TIMEOUT=1320 KEEP_GOING=1 bash bench/gpu_call_tune_rows.sh "$D"
echo done > "$D/DONE"
