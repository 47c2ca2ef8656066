# Sourced by the device session scripts (bench/gpu_session_queue.sh, bench/gpu_call_s48.sh) after
# bench/gpu_session_setup.sh: probe LETTER FOLDER TIMEOUT_S MODELS STACKS runs
# bench/stack_probe.py, its log beside its summary, packed as $D/LETTER/round.tgz (which
# bench/gpu_poll.sh brings back); a letter in QUEUE_SKIP (comma-separated) is left out: its
# session ran that probe earlier. EXTRA: more options for stack_probe.py (EXTRA="--rounds 3").
probe() {
    case ",${QUEUE_SKIP:-}," in *",$1,"*) return 0 ;; esac
    mkdir -p "$D/$1/$2"
    # shellcheck disable=SC2086  # EXTRA is options, split on spaces
    timeout "$3" python bench/stack_probe.py --models "$4" --stacks "$5" ${EXTRA:-} \
        --out "$D/$1/$2" > "$D/$1.out" 2>&1
    cp "$D/$1.out" "$D/$1/$2/session.log"; (cd "$D/$1" && tar -czf round.tgz "$2")
}
