#!/usr/bin/env bash
# A device session of issue 33's goal table (background, polled by bench/gpu_poll.sh): levers
# tune --budget B against the peers, one model after another on each GPU of the machine (the
# models dealt round-robin over the GPUs, one process per model), each row merged into
# $D/a<gpu>/tune_sweep_h200/summary.json as it lands (bench/tune_sweep.py), so that a session
# cut short keeps the rows it finished. On one GPU that is one list after another.
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> MODELS="zoo@llama,arch@opt" SAMPLE=8:33 BUDGET=3m bash bench/gpu_call_tune_rows.sh /tmp/g
# MODELS and SAMPLE (N:SEED, a seeded sample of N architectures outside the zoo) may each be
# empty, not both; RETIME=SUMMARY times the stacks of that summary's rows beside the peers
# instead of searching (tune_sweep.py --retime); ROUNDS=R times the variants R times
# (tune_sweep.py --rounds); ROW_TIMEOUT (seconds per model, default 840) must hold the budget and ~6
# timed rows of the peers.
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
gpus=$(nvidia-smi -L | wc -l)
sample=()
[ -n "${SAMPLE:-}" ] && sample=(--arch-sample "$SAMPLE")
retime=()  # RETIME=SUMMARY: time each model's earlier stack beside the peers, no search
[ -n "${RETIME:-}" ] && retime=(--retime "$RETIME")
peers=()  # every peer of tune_sweep.py unless PEERS narrows them (reduce-overhead compile is one)
[ -n "${PEERS:-}" ] && peers=(--peers "$PEERS")
rounds=()  # ROUNDS=R: the default, the stack and the peers timed R times (tune_sweep.py --rounds)
[ -n "${ROUNDS:-}" ] && rounds=(--rounds "$ROUNDS")
one_gpu() {
    local i=$1 out="$D/a$i"
    mkdir -p "$out"
    for model in $(python bench/tune_sweep.py --models "${MODELS:-}" "${sample[@]}" --part "$i/$gpus" --list); do
        CUDA_VISIBLE_DEVICES=$i timeout "${ROW_TIMEOUT:-840}" python bench/tune_sweep.py \
            --models "$model" --budget "${BUDGET:-3m}" \
            "${peers[@]}" "${retime[@]}" "${rounds[@]}" \
            --out "$out/tune_sweep_h200" >> "$D/a$i.out" 2>&1
        cp "$D/a$i.out" "$out/tune_sweep_h200/session.log"
        (cd "$out" && tar -czf round.tgz tune_sweep_h200)
    done
}
for ((i = 0; i < gpus; i++)); do one_gpu "$i" & done
wait
[ -z "${KEEP_GOING:-}" ] && echo done > "$D/DONE"  # KEEP_GOING=1: a caller runs more after
