#!/usr/bin/env bash
# A device session of issue 33 after s57c with the last minutes of device time: levers tune's 3m
# search on the zoo's phi alone (no peers: s56 timed them on the H200, s55 on the H100), its A/Bs
# alternating their sides in windows of steps (levers.ab.timing): whether float8 is kept on the
# compile form now (s55, step by step, H100: float8 read 1.000x and was left out).
# Usage (repository root, on the device):
#   LEVERS_COMMIT=<hash> bash bench/gpu_call_s57e.sh /tmp/n
source bench/gpu_session_setup.sh "${1:-/tmp/n}"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=/tmp/site:src
P="$D/p/tune_sweep_h200"
mkdir -p "$P"
timeout 330 python - "$P" > "$P/tune_phi_3m.log" 2>&1 <<'PY'
import json, sys, levers
from pathlib import Path
from levers.output.atomic import atomic_write_text
out = Path(sys.argv[1])
params = {"model": "phi", "size": "full", "device": "cuda"}
result = levers.Step("zoo", params=params).tune(
    budget="3m", record=out / "tune.record.jsonl", progress=lambda line: print(" ", line, flush=True))
proof = result.proof
summary = {"model": "zoo@phi", "stack": list(result.stack), "unconfirmed": list(result.unconfirmed),
           "tokens_per_s_ratio": getattr(proof, "tokens_per_s_ratio", None),
           "tokens_per_s_ratio_ci95": getattr(proof, "tokens_per_s_ci95", None),
           "trials": [{"base": list(t.base), "stack": list(t.stack), "decision": t.decision,
                       "tokens_per_s_ratio": t.tokens_per_s_ratio,
                       "tokens_per_s_ci95": t.tokens_per_s_ci95, "step_ms": t.step_ms,
                       "role": t.role} for t in result.search.trials]}
atomic_write_text(out / "tune_phi_3m.json", json.dumps(summary, indent=1, default=str))
print("stack", summary["stack"], summary["tokens_per_s_ratio"], summary["tokens_per_s_ratio_ci95"])
PY
echo done > "$D/DONE"
