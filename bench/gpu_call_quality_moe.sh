#!/usr/bin/env bash
# One device call (polled): the quality reads run side by side on the one GPU (their losses and
# memory do not depend on what else runs; their step times do and are marked contended), then
# the GPU tests and float8's quality read, then, alone on the GPU, the timed MoE rows.
# Usage (repository root, on the device): LEVERS_COMMIT=<hash> bash bench/gpu_call_quality_moe.sh /tmp/g
set -u
D=${1:-/tmp/g}
mkdir -p "$D"
OUT=$D/a setsid bash bench/gpu_round.sh optstate_bf16 > "$D/a.out" 2>&1 &
A=$!
OUT=$D/b setsid bash bench/gpu_round.sh optstate_8bit > "$D/b.out" 2>&1 &
B=$!
OUT=$D/c bash bench/gpu_round.sh newgpu float8_quality gputests > "$D/c.out" 2>&1
wait $A $B
OUT=$D/d bash bench/gpu_round.sh moe memmoe auditmoe > "$D/d.out" 2>&1
echo done > "$D/DONE"
