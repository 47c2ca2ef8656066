"""How many training steps the memory model runs after the build, by default: read by the model
(:mod:`levers.memory.fake`) and by ``levers memory --help``, which must not import torch."""

DEFAULT_NUM_STEPS = 3
