#!/usr/bin/env bash
# Device session s33b of issue 33 (background, polled by bench/gpu_poll.sh): levers tune on an
# unchanged GPU training script (bench/script_goal.py: bench/train_decoder.py, a GPT-NeoX-style
# decoder at 8 x 2048) against the peers applied by hand in the same script.
# Usage (repository root, on the device): LEVERS_COMMIT=<hash> bash bench/gpu_call_s33b.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
mkdir -p "$D/b"
timeout 560 python bench/script_goal.py --budget 5m --out "$D/b/script_goal_h200" > "$D/b.out" 2>&1
cp "$D/b.out" "$D/b/script_goal_h200/s33b.log"; (cd "$D/b" && tar -czf round.tgz script_goal_h200)
echo done > "$D/DONE"
