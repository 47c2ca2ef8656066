#!/usr/bin/env bash
# Poll a background device session for up to $1 seconds (default 560): copies what its jobs
# packed so far ($D/*/round.tgz, the *.out logs) to $OUT and returns when DONE appears.
# Usage (on the device): OUT=... bash bench/gpu_poll.sh 560 /tmp/g
LIMIT=${1:-560}; D=${2:-/tmp/g}
if [ ! -d "$D" ]; then  # a fresh machine: the one that ran the session was taken back
    echo "no $D here: this is a fresh machine, the session's machine and its results are gone"
    exit 3
fi
t0=$SECONDS
while [ $((SECONDS - t0)) -lt "$LIMIT" ] && [ ! -f "$D/DONE" ]; do sleep 10; done
# a tune-rows folder is packed as it stands (its summary.json is rewritten after each variant,
# atomically): a row the session's end cuts keeps the variants it timed, marked incomplete
for x in "$D"/*/; do
    n=$(basename "$x")
    if [ -d "$x/tune_sweep_h200" ]; then
        (cd "$x" && tar -czf "$OUT/$n.tgz" tune_sweep_h200)
    elif [ -f "$x/round.tgz" ]; then
        cp "$x/round.tgz" "$OUT/$n.tgz"
    fi
done
tail -n 25 "$D"/*.out
ls "$D"; nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
