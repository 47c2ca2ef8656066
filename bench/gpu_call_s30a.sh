#!/usr/bin/env bash
# One device session, started in the background and polled (bench/gpu_poll.sh), one job at a time
# on the GPU, for issue 21: the compiled checkpointing rows with the corrected prediction and
# with a fused loss, raise-batch with the prediction of the stack that runs, the ViT's optional
# rows (float8, cuDNN attention, max-autotune), the audit of the llama 1b (DTYPE003 on a GPU
# capture), then the GPU tests, cut wherever the session's device time ends.
# Usage (repository root, on the device): LEVERS_COMMIT=<hash> bash bench/gpu_call_s30a.sh /tmp/g
source bench/gpu_session_setup.sh "${1:-/tmp/g}"
OUT=$D/a bash bench/gpu_round.sh ac_flce > "$D/a.out" 2>&1
OUT=$D/b bash bench/gpu_round.sh peers_rb_llama > "$D/b.out" 2>&1
OUT=$D/c bash bench/gpu_round.sh peers_vit_more > "$D/c.out" 2>&1
OUT=$D/d bash bench/gpu_round.sh audit_llama > "$D/d.out" 2>&1
OUT=$D/e bash bench/gpu_round.sh gputests > "$D/e.out" 2>&1
echo done > "$D/DONE"
