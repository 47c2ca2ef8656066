#!/usr/bin/env bash
# A device session's first job (issue 33, vit's miss in bench/results/tune_sweep_h200, s36b):
# levers ab of compile-blocks on the zoo's vit alone, in a fresh process, then the same A/B after
# a compile-model A/B in one process (what tune does), to tell the lever's own cost from one left
# by the A/Bs before it; then the goal rows of MODELS as bench/gpu_call_tune_rows.sh runs them.
# Usage (repository root, on the device; polled by bench/gpu_poll.sh):
#   LEVERS_COMMIT=<hash> MODELS="zoo@gemma,zoo@t5" BUDGET=3m bash bench/gpu_call_vit_check.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
mkdir -p "$D/v/vit_check"
VIT=(zoo --set model=vit size=full device=cuda --steps 20 --warmup 3)
python -m levers.cli ab "${VIT[@]}" --lever compile-blocks --json "$D/v/vit_check/alone.json" \
    > "$D/v/vit_check/alone.log" 2>&1
python - "$D/v/vit_check" > "$D/v/vit_check/sequence.log" 2>&1 <<'PY'
import json, sys
from torch._dynamo.utils import counters
from levers.tune.measure import TrialDesign, ab_measure
out = sys.argv[1]
measure = ab_measure("zoo", {"model": "vit", "size": "full", "device": "cuda"}, TrialDesign())
rows = []
for stack in (("compile-model",), ("compile-blocks",), ("compile-blocks",)):
    trial = measure((), stack, 600.0)
    rows.append({"stack": list(stack), "ratio": trial.tokens_per_s_ratio, "ci95": trial.tokens_per_s_ci95,
                 "step_ms": trial.step_ms, "phase_s": trial.phase_s, "decision": trial.decision,
                 "dynamo": {k: dict(v) for k, v in counters.items() if k in ("stats", "recompiles", "frames", "graph_break")}})
    print(rows[-1], flush=True)
json.dump(rows, open(f"{out}/sequence.json", "w"), indent=1)
PY
(cd "$D/v" && tar -czf round.tgz vit_check)
exec bash bench/gpu_call_tune_rows.sh "$D"
