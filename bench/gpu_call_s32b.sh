#!/usr/bin/env bash
# Device session s32b of issue 33 (background, polled by bench/gpu_poll.sh): levers tune against
# the peers on two families outside the zoo where it found nothing (BLOOM: ALiBi, 250k
# vocabulary; OPT: dropout 0.1), then on an unchanged GPU training script (bench/script_goal.py).
# Usage (repository root, on the device): LEVERS_COMMIT=<hash> bash bench/gpu_call_s32b.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
mkdir -p "$D/a" "$D/b" "$D/c"
OZ=bench/outside_zoo.py:make
timeout 480 python bench/tune_sweep.py --models "$OZ@bloom" --budget 3m \
    --peers compile-model,compile-layers,torchtitan-float8 --out "$D/a/tune_sweep_h200" > "$D/a.out" 2>&1
cp "$D/a.out" "$D/a/tune_sweep_h200/s32b_bloom.log"; (cd "$D/a" && tar -czf round.tgz tune_sweep_h200)
timeout 660 python bench/script_goal.py --budget 5m --out "$D/b/script_goal_h200" > "$D/b.out" 2>&1
cp "$D/b.out" "$D/b/script_goal_h200/s32b.log"; (cd "$D/b" && tar -czf round.tgz script_goal_h200)
timeout 480 python bench/tune_sweep.py --models "$OZ@opt" --budget 3m \
    --peers compile-model,compile-layers,torchtitan-float8 --out "$D/c/tune_sweep_h200" > "$D/c.out" 2>&1
cp "$D/c.out" "$D/c/tune_sweep_h200/s32b_opt.log"; (cd "$D/c" && tar -czf round.tgz tune_sweep_h200)
echo done > "$D/DONE"
