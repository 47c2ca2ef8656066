"""Random numbers drawn alike on both sides of a parity check, when one side is compiled.

inductor draws the random numbers of a compiled program (dropout's masks) with its own generator
code, so a correct compiled step of a model with dropout takes other masks than the eager step,
and its loss and gradients differ from eager's by those masks: 2.2-2.4% in the gradient norm
after three steps on an H200, far past bf16's parity tolerance. inductor's ``fallback_random``
makes it call eager's random ops instead (PyTorch's own accuracy checks of compiled models set it
for this reason); with it, a compiled dropout on the CPU gives the eager masks bit for bit.

:func:`drawn_alike` turns it on for the parity steps. inductor bakes the setting into what it
compiles, and the timed steps must run the program the user would run (inductor's own random
numbers, fused into its kernels), so a program compiled while the setting was on is dropped
before the timed steps (``torch._dynamo.reset()``: the warm-up compiles it again) when the step
draws random numbers inside the model; when it draws none, the programs are the same either way
and are kept. ``levers tune`` keeps them (``AbConfig.time_parity_programs``): one compile of a
compiled stack instead of two (T5 on an H100: ~95 s each), its timed steps then drawing random
numbers with eager's kernels beside the compiled ones, which the trial and its proof say; except
a program replayed as CUDA graphs, which does not time as the user's so (the runner's
``_programs_for_timing``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class Compiled:
    """What happened while :func:`drawn_alike` was on."""

    graphs: int = 0  # programs dynamo compiled meanwhile

    @property
    def any(self) -> bool:
        return self.graphs > 0


def _unique_graphs() -> int:
    # dynamo takes seconds to import: only a step that compiled has it loaded already
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


@contextmanager
def drawn_alike() -> Iterator[Compiled]:
    """inductor draws random numbers with eager's ops while on; yields what was compiled.

    Where nothing has asked for inductor yet (``torch.compile`` with it imports its config), no
    program of it can be made meanwhile: the setting is left alone, and inductor not imported.
    """
    seen = Compiled()
    inductor_config = sys.modules.get("torch._inductor.config")
    if inductor_config is None:
        yield seen
        return
    before_graphs = _unique_graphs()
    before = inductor_config.fallback_random
    inductor_config.fallback_random = True
    try:
        yield seen
    finally:
        inductor_config.fallback_random = before
        seen.graphs = _unique_graphs() - before_graphs


def recompile_for_timing(compiled: Compiled, draws_random: bool | None) -> bool:
    """Drop the programs compiled with eager's random ops, when they differ from the user's:
    something was compiled meanwhile and the step draws random numbers in the model (or whether
    it does is not known). Returns whether it reset dynamo."""
    if not compiled.any or draws_random is False:
        return False
    import torch._dynamo  # loaded already: something was compiled

    torch._dynamo.reset()
    return True
