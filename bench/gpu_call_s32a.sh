#!/usr/bin/env bash
# One device session of issue 33, started in the background (setsid) and polled with
# bench/gpu_poll.sh: the GPU tests of the float64 reference and the parity gate, then levers tune
# against the peers (bench/tune_sweep.py) on the zoo GPT-2 (dropout 0.1).
# Usage (repository root, on the device): LEVERS_COMMIT=<hash> bash bench/gpu_call_s32a.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
mkdir -p "$D/a" "$D/b"
timeout 300 python -m pytest -q -p no:cacheprovider -rfEs -m gpu tests/zoo/test_zoo_reference_gpu.py \
    tests/ab/test_ab_parity_reference.py tests/ab/test_ab_gpu.py tests/levers/test_levers_gpu.py \
    > "$D/a.out" 2>&1
(cd "$D/a" && tar -czf round.tgz -C "$D" a.out)
timeout 1200 python bench/tune_sweep.py --models zoo:gpt2 --budget 3m \
    --deadline-s 300 --out "$D/b/tune_sweep_h200" > "$D/b.out" 2>&1
cp "$D/b.out" "$D/b/tune_sweep_h200/log.txt"
(cd "$D/b" && tar -czf round.tgz tune_sweep_h200)
echo done > "$D/DONE"
