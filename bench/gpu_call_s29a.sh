#!/usr/bin/env bash
# One device session, started in the background and polled (bench/gpu_poll.sh), one job at a time
# on the GPU: issue 21's goal table for the llama 1b, the GPU tests (the fixes of the last session
# not yet run on a GPU), the same goal table for qwen2, the capture's alignment (autocast casts
# joined), then the ViT's optional rows, cut wherever the session's device time ends.
# Usage (repository root, on the device): LEVERS_COMMIT=<hash> bash bench/gpu_call_s29a.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
OUT=$D/a bash bench/gpu_round.sh peers_goal_llama > "$D/a.out" 2>&1
OUT=$D/b bash bench/gpu_round.sh gputests > "$D/b.out" 2>&1
OUT=$D/c bash bench/gpu_round.sh peers_goal_qwen2 > "$D/c.out" 2>&1
OUT=$D/d bash bench/gpu_round.sh alignment peers_vit_more > "$D/d.out" 2>&1
echo done > "$D/DONE"
