#!/usr/bin/env bash
# s49's last device minutes (~6 left): the channels-last GPU tests (alone and under compile-model's
# CUDA graphs, the zoo's BatchNorm resnet on CUDA), then channels-last under whole-model compile
# on the zoo's resnet and convnext (stack_probe), each packed as soon as it ends.
# Usage (repository root, on the device): OUT=... bash bench/gpu_call_s49_lean.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
source bench/gpu_session_probe.sh
bash bench/gpu_session_tests.sh "$D" 120 tests/zoo/test_compile_graphs_gpu.py -k "channels_last or cuda_graph_form"
cp "$D/t/round.tgz" "$OUT/t.tgz"; tail -n 5 "$D/t/gpu_tests/pytest.log"
probe c channels_last_probe 150 zoo@resnet,zoo@convnext "compile-model;channels-last+compile-model;channels-last"
cp "$D/c/round.tgz" "$OUT/c.tgz"; tail -n 12 "$D/c.out"
