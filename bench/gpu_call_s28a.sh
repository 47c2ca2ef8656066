#!/usr/bin/env bash
# One device session, started in the background and polled (no gap over the device's 30 s idle
# release): the capture overhead alone on the GPU (a timing), then side by side the jobs whose
# results do not depend on what else runs (adamw-8bit's held-out-loss read, levers memory's
# compiled prediction against the H200, the GPU tests).
# Usage (repository root, on the device): LEVERS_COMMIT=<hash> bash bench/gpu_call_s28a.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
OUT=$D/a bash bench/gpu_round.sh capture > "$D/a.out" 2>&1
OUT=$D/b setsid bash bench/gpu_round.sh optstate_8bit > "$D/b.out" 2>&1 &
OUT=$D/c setsid bash bench/gpu_round.sh memcompile > "$D/c.out" 2>&1 &
OUT=$D/d bash bench/gpu_round.sh gputests > "$D/d.out" 2>&1
wait
echo done > "$D/DONE"
