#!/usr/bin/env bash
# One device session (started in the background, then polled by further calls with no gap over
# the device's 30 s idle release): the optimizer-state quality reads run side by side on the one
# GPU (their losses and memory do not depend on what else runs; their step times do, and are
# marked contended), beside the new GPU tests and float8's 200-step quality read; then, alone on
# the GPU, the timed MoE rows, MoE memory, the MoE audit and the GPU tests.
# The wheels are installed once, before the parallel jobs (two pip installs into one --target
# collide), and the jobs run from a copy without .whl/ so gpu_round.sh does not reinstall.
# Usage (repository root, on the device): LEVERS_COMMIT=<hash> bash bench/gpu_call_quality_moe.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
OUT=$D/a setsid bash bench/gpu_round.sh optstate_bf16 > "$D/a.out" 2>&1 &
OUT=$D/b setsid bash bench/gpu_round.sh optstate_8bit > "$D/b.out" 2>&1 &
OUT=$D/c bash bench/gpu_round.sh newgpu float8_quality > "$D/c.out" 2>&1
while pgrep -f "bench/optimizer_state[.]py" > /dev/null; do sleep 5; done
OUT=$D/d bash bench/gpu_round.sh moe memmoe auditmoe gputests > "$D/d.out" 2>&1
echo done > "$D/DONE"
