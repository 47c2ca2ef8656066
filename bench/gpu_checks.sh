#!/usr/bin/env bash
# The GPU checks of the capture and the audit, in one call of a GPU machine.
# Usage (repository root, torch with CUDA): OUT=some/dir bash bench/gpu_checks.sh
# Writes under $OUT: gpu_tests.txt, audit_demo_1b.{txt,md,json}, audit_microbench_h200.jsonl,
# audit_demo_1b_fixed.txt, audit_llama_1b.txt.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" COLUMNS=160
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
git_commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
echo "commit $git_commit"

timeout 150 python -m pytest -q -p no:cacheprovider -rfE -m gpu tests > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests rc=$?"; tail -25 "$OUT/gpu_tests.txt"

timeout 150 python -m levers.cli audit demo --set device=cuda size=1b \
    --findings-json "$OUT/audit_demo_1b.json" --md "$OUT/audit_demo_1b.md" > "$OUT/audit_demo_1b.txt" 2>&1
echo "audit demo rc=$?"; sed -n '/findings for/,$p' "$OUT/audit_demo_1b.txt" | head -80

timeout 70 python bench/audit_microbench.py --audit-json "$OUT/audit_demo_1b.json" \
    --out "$OUT/audit_microbench_h200.jsonl" 2>&1 | tail -15

timeout 90 python -m levers.cli audit demo --set device=cuda size=1b fixed=all --no-benchmark --no-memory-model \
    > "$OUT/audit_demo_1b_fixed.txt" 2>&1
echo "audit demo fixed=all rc=$?"; sed -n '/findings for/,$p' "$OUT/audit_demo_1b_fixed.txt" | head -40

timeout 100 python -m levers.cli audit llama --set device=cuda size=1b --no-benchmark \
    > "$OUT/audit_llama_1b.txt" 2>&1
echo "audit llama rc=$?"; sed -n '/findings for/,$p' "$OUT/audit_llama_1b.txt" | head -30
grep -h "warning" "$OUT"/audit_*.txt
