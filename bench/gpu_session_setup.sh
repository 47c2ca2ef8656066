# Sourced by the bench/gpu_call_*.sh scripts (repository root, on the device): the wheels of
# .whl/ installed once into /tmp/site (two pip installs into one --target collide, so the jobs
# that run side by side must not each install them), then the checkout copied without .whl/ to
# /tmp/levers_copy, where gpu_round.sh finds no wheels to reinstall, and the shell moved there.
# Sets D, the folder the session's jobs write to (the script's first argument, default /tmp/g).
set -u
D=${1:-/tmp/g}
if [ "${LEVERS_SESSION_READY:-}" = 1 ]; then  # a job started by another that set up already
    cd /tmp/levers_copy && export PYTHONPATH=/tmp/site
    return 0
fi
mkdir -p "$D" /tmp/levers_copy
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
tar --exclude=./.whl -cf - . | tar -xf - -C /tmp/levers_copy
cd /tmp/levers_copy
export PYTHONPATH=/tmp/site LEVERS_SESSION_READY=1
