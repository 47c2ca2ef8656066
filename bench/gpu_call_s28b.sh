#!/usr/bin/env bash
# One device session, started in the background and polled (bench/gpu_poll.sh): the capture's
# GPU tests and what each of its passes saw alone, then alone on the GPU one timing after
# another: the capture overhead (the join now by Myers' alignment), pad-to-multiple's varied
# widths, the ViT-B/16 rows that decide its goal and the compiled checkpointing rows at
# torch's ratio 0.5 (the shorter jobs: the session's device time is 20 minutes).
# Usage (repository root, on the device): LEVERS_COMMIT=<hash> bash bench/gpu_call_s28b.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
OUT=$D/a bash bench/gpu_round.sh captests alignment capture > "$D/a.out" 2>&1
OUT=$D/b bash bench/gpu_round.sh varlen_varied > "$D/b.out" 2>&1
OUT=$D/c bash bench/gpu_round.sh peers_vit_core > "$D/c.out" 2>&1
OUT=$D/d bash bench/gpu_round.sh ac_compiled_05 > "$D/d.out" 2>&1
echo done > "$D/DONE"
