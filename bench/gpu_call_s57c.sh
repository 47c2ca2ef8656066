#!/usr/bin/env bash
# A device session of issue 33 after s57b, polled with bench/gpu_poll.sh 270. s57b on the H100:
# phi's float8 A/B on per-block compile read 0.998x with its sides alternating step by step and
# 1.039x with them one at a time, while the GPU ran at its power cap (clocks 1665-1980 MHz,
# reason 0x4; float8's steps drew ~50-90 W less than the baseline's). Whether alternating in
# windows of steps (about 0.5 s and 1 s of them a side) reads what the sides one at a time
# read, on phi and on mistral (whose A/B read 1.070x step by step, 1.080x built fresh), with the
# GPU's clocks and power logged every 100 ms.
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> bash bench/gpu_call_s57c.sh /tmp/k
source bench/gpu_session_setup.sh "${1:-/tmp/k}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
P="$D/p/tune_sweep_h200"
mkdir -p "$P"
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv -lms 100 > "$P/gpu_clocks_s57c.csv" 2>&1 &
SMI=$!
probe() {
    timeout 400 python bench/cudagraphs_probe.py --models "zoo@$1" --warmup 4 --steps 15 \
        --stacks "compile-blocks" --ab "compile-blocks>compile-blocks+float8" \
        --ab-sides "$2" --ab-as-tune-only \
        --out "$P/float8_windows_$1" > "$P/float8_windows_$1.log" 2>&1
}
probe phi together:0.5,together,one-at-a-time,together:1.0
probe mistral together:0.5,together
kill $SMI
echo done > "$D/DONE"
