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
for x in "$D"/*/; do n=$(basename "$x"); [ -f "$x/round.tgz" ] && cp "$x/round.tgz" "$OUT/$n.tgz"; done
tail -n 25 "$D"/*.out
ls "$D"; nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
