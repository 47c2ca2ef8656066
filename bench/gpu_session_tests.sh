#!/usr/bin/env bash
# The GPU tests a device session runs before its rows: pytest -m gpu on the tests named, its
# output and exit status in $D/t/gpu_tests/pytest.log, packed as $D/t/round.tgz (which
# bench/gpu_poll.sh brings back). The session scripts up to s40 wrote these lines out each.
# Usage (on the device, after bench/gpu_session_setup.sh):
#   bash bench/gpu_session_tests.sh D TIMEOUT_S PYTEST_ARGS...
D=$1 limit=$2
shift 2
mkdir -p "$D/t/gpu_tests"
timeout "$limit" python -m pytest -q -p no:cacheprovider -rfEs -m gpu "$@" \
    > "$D/t/gpu_tests/pytest.log" 2>&1
echo "rc=$?" >> "$D/t/gpu_tests/pytest.log"
(cd "$D/t" && tar -czf round.tgz gpu_tests)
