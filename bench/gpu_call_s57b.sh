#!/usr/bin/env bash
# A device session of issue 33 after s57a, polled with bench/gpu_poll.sh 270. s57a on the H100:
# phi's per-block compile and its float8 stack built fresh ran 90.78 and 86.85 ms a step
# (1.045x), where tune's A/B of float8 on per-block compile read 0.995x (as tune times it) and
# 1.004x (compiled again): in the A/B the baseline ran 88.0 and float8 88.3 ms. Whether that is
# the alternation of two live sides, the order the forms ran in or the GPU's clocks: the GPU's SM
# clock, power and temperature logged every 100 ms beside the run, the two forms built fresh in
# turn twice (float8 first), then the A/B with its sides together and one at a time.
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> bash bench/gpu_call_s57b.sh /tmp/h
source bench/gpu_session_setup.sh "${1:-/tmp/h}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
P="$D/p/tune_sweep_h200"
mkdir -p "$P"
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv -lms 100 > "$P/gpu_clocks.csv" 2>&1 &
SMI=$!
probe() {
    timeout 540 python bench/cudagraphs_probe.py --models "zoo@$1" --warmup 4 --steps 15 \
        --stacks "compile-blocks+float8;compile-blocks;compile-blocks+float8;compile-blocks" \
        --ab "compile-blocks>compile-blocks+float8" --ab-sides together,one-at-a-time \
        --out "$P/float8_sides_$1" > "$P/float8_sides_$1.log" 2>&1
}
probe phi
kill $SMI
echo done > "$D/DONE"
