"""The cost model: a finding's work priced on a GPU.

- :mod:`gpus`: the datasheet ceilings of the target GPUs.
- :mod:`roofline`: time of a group of kernels from FLOPs, bytes and launches.
- :mod:`estimate`: prices a finding's work for a target GPU (CPU captures).
- :mod:`measure`: measured device time of the ops a finding names, and microbenchmarks of the
  fix at the shapes seen (GPU captures).
- :mod:`price`: picks one or the other and returns findings with ``cost`` set.
"""
