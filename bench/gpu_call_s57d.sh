#!/usr/bin/env bash
# A device session of issue 33 after s57c, polled with bench/gpu_poll.sh. levers' A/Bs on CUDA
# now alternate their sides in windows of about 0.5 s of steps (levers.ab.timing): on the H100
# float8 on phi's per-block compile read 1.027x [1.017, 1.036] so, against 1.000x step by step.
# phi's 3m row again (s55: compile-blocks alone, 0.970 of torchtitan's float8 recipe), beside the
# peers that lead on phi (per-layer compile, torchtitan's float8; the whole-model compile forms
# ran 1.75x against their 1.91x and 1.97x in s55): the device time left is short.
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> bash bench/gpu_call_s57d.sh /tmp/m
source bench/gpu_session_setup.sh "${1:-/tmp/m}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
MODELS=zoo@phi SAMPLE= BUDGET=3m ROW_TIMEOUT=470 KEEP_GOING=1 PEERS=compile-layers,torchtitan-float8 \
    bash bench/gpu_call_tune_rows.sh "$D"
echo done > "$D/DONE"
