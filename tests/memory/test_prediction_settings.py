"""A prediction leaves the process's compile settings as it found them."""

from __future__ import annotations

import torch._dynamo.config
import torch._inductor.config

from levers.hardware import resolve_gpu
from levers.memory.prediction import run_prediction, source_of


def test_the_levers_a_prediction_applies_leave_no_compile_setting_behind():
    # ac-budget's plan on compiled blocks predicts the step with compile-blocks applied to a
    # workload of fake tensors, which is dropped without its undo: dynamo's unspecialised ints
    # stayed on in the user's process (and turned the audit's COMP001 off in the test run after)
    dynamo, inductor = torch._dynamo.config, torch._inductor.config
    before = (dynamo.allow_unspec_int_on_nn_module, dynamo.recompile_limit,
              inductor.fallback_random)

    def transform(workload):
        dynamo.allow_unspec_int_on_nn_module = True
        dynamo.recompile_limit = 99
        inductor.fallback_random = not inductor.fallback_random

    seen = []
    run_prediction(source_of("llama", {"size": "tiny", "batch_size": 1}), resolve_gpu("h200"),
                   num_steps=1, transform=lambda w: (transform(w), seen.append(
                       dynamo.allow_unspec_int_on_nn_module)))
    assert seen == [True]  # set while the prediction ran
    assert (dynamo.allow_unspec_int_on_nn_module, dynamo.recompile_limit,
            inductor.fallback_random) == before
