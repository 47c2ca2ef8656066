"""levers under torchrun: each rank captures its own step; rank 0 merges and reports.

- :mod:`levers.distributed.world`: this process's rank and world size, from the environment.
- :mod:`levers.distributed.exchange`: rank 0 gathers one record per rank, with a timeout that
  names the ranks that did not answer, and tells the others how the run ended.
- :mod:`levers.distributed.summary`: one rank's record (step time, compute, communication by
  collective and DDP bucket), or the error it raised.
- :mod:`levers.distributed.merge`: the merged report (stragglers, communication against compute).
- :mod:`levers.distributed.render`: terminal, JSON and Markdown of the merged report.
- :mod:`levers.cli.audit_distributed`: ``levers audit`` under torchrun.

Distribution itself is PyTorch's (torch.distributed, DDP, FSDP2); levers adds no collective
to the user's process groups.
"""
