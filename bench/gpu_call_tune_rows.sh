#!/usr/bin/env bash
# A device session of issue 33's goal table (background, polled by bench/gpu_poll.sh): levers
# tune --budget B against the peers, one model after another, each row merged into
# $D/a/tune_sweep_h200/summary.json as it lands (bench/tune_sweep.py), so that a session cut
# short keeps the rows it finished.
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> MODELS="zoo@llama,zoo@qwen2,arch@opt" BUDGET=3m bash bench/gpu_call_tune_rows.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
mkdir -p "$D/a"
IFS=, read -ra models <<< "${MODELS:?name the models: MODELS=zoo@llama,arch@opt}"
for model in "${models[@]}"; do
    timeout 540 python bench/tune_sweep.py --models "$model" --budget "${BUDGET:-3m}" \
        --peers "${PEERS:-compile-model,compile-layers,torchtitan-float8}" \
        --out "$D/a/tune_sweep_h200" >> "$D/a.out" 2>&1
    cp "$D/a.out" "$D/a/tune_sweep_h200/session.log"; (cd "$D/a" && tar -czf round.tgz tune_sweep_h200)
done
echo done > "$D/DONE"
