#!/usr/bin/env bash
# Device session s33a of issue 33 (background, polled by bench/gpu_poll.sh): the GPU tests of
# tune on a script (its windows) and of the float64 reference (mixtral, after the float32 run of
# torch._grouped_mm), then levers tune against the peers on BLOOM (ALiBi, 250k vocabulary), where
# tune found nothing at 0391af3 and whole-model compile gave 1.56x.
# Usage (repository root, on the device): LEVERS_COMMIT=<hash> bash bench/gpu_call_s33a.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
mkdir -p "$D/t/gpu_tests_h200" "$D/a"
timeout 240 python -m pytest -q -rA tests/tune/test_gpu_script_tune.py \
    "tests/zoo/test_zoo_reference_gpu.py::test_the_float64_reference_of_a_zoo_model_is_finite_on_the_gpu[mixtral]" \
    > "$D/t.out" 2>&1
cp "$D/t.out" "$D/t/gpu_tests_h200/s33a_pytest.log"; (cd "$D/t" && tar -czf round.tgz gpu_tests_h200)
timeout 420 python bench/tune_sweep.py --models bench/outside_zoo.py:make@bloom --budget 3m \
    --peers compile-model,compile-layers --out "$D/a/tune_sweep_h200" > "$D/a.out" 2>&1
cp "$D/a.out" "$D/a/tune_sweep_h200/s33a_bloom.log"; (cd "$D/a" && tar -czf round.tgz tune_sweep_h200)
echo done > "$D/DONE"
