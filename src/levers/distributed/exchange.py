"""Rank 0 gathers one record per rank, and tells every rank how the run ended.

The records travel through torchrun's key-value store (the ``TCPStore`` at ``MASTER_ADDR``:
``MASTER_PORT`` that its rendezvous already runs), not through a collective on the user's
process groups: a collective that times out cannot say which rank is missing, and one that
hangs would hang every rank. Each rank writes its record under its own key; rank 0 waits for
all keys with a timeout and, on timeout, names the ranks whose keys are absent. The other ranks
then wait (with the same timeout) for rank 0's outcome, so that no rank exits before rank 0 has
reported: torchrun stops every worker as soon as one exits with an error.

When no store server runs yet (a launcher other than torchrun's agent, and no process group),
the default process group is initialised from ``env://`` (gloo, with the timeout), whose
rendezvous starts the store on rank 0.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from levers.distributed.world import World
from levers.errors import LeversError

DEFAULT_TIMEOUT_S = 300.0


class RankTimeout(LeversError):
    """A rank did not answer within the timeout (it hung, or its process died)."""

    exit_code = 3


def _ranks(ranks: tuple[int, ...]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


@dataclass(frozen=True)
class Gathered:
    """The records that reached rank 0 (in rank order) and the ranks that did not answer."""

    records: tuple[dict[str, Any], ...]
    missing: tuple[int, ...]
    timeout_s: float

    def missing_message(self) -> str:
        return (
            f"{_ranks(self.missing)} did not answer within {self.timeout_s:g} s (it hung or its "
            "process died; torchrun's log above shows which); raise --dist-timeout if the step "
            "is legitimately slower on some ranks"
        )


@dataclass(frozen=True)
class Exchange:
    world: World
    store: Any  # a torch.distributed.Store, keys under this launch's prefix
    timeout_s: float

    @property
    def _timeout(self) -> timedelta:
        return timedelta(seconds=self.timeout_s)

    def gather(self, tag: str, record: dict[str, Any]) -> Gathered | None:
        """Rank 0: every rank's record for ``tag`` (waiting up to the timeout); others: None."""
        self.store.set(f"{tag}/{self.world.rank}", json.dumps(record))
        if not self.world.is_leader:
            return None
        keys = [f"{tag}/{rank}" for rank in range(self.world.world_size)]
        try:
            self.store.wait(keys, self._timeout)
        except RuntimeError:  # DistStoreError: some key did not appear in time
            pass
        present = [self.store.check([key]) for key in keys]
        records = tuple(
            json.loads(self.store.get(key)) for key, here in zip(keys, present) if here
        )
        missing = tuple(rank for rank, here in enumerate(present) if not here)
        return Gathered(records=records, missing=missing, timeout_s=self.timeout_s)

    def publish(self, tag: str, outcome: dict[str, Any]) -> None:
        """Rank 0: how the run ended, for the other ranks' exit codes."""
        self.store.set(f"{tag}/outcome", json.dumps(outcome))

    def outcome(self, tag: str) -> dict[str, Any]:
        """Ranks other than 0: rank 0's outcome for ``tag``.

        Raises:
            RankTimeout: rank 0 published nothing within the timeout.
        """
        key = f"{tag}/outcome"
        try:
            self.store.wait([key], self._timeout)
        except RuntimeError:
            raise RankTimeout(
                f"rank {self.world.rank}: rank 0 did not answer within {self.timeout_s:g} s (it "
                "hung, died, or is blocked in a collective of the workload that this rank never "
                "joined)"
            ) from None
        return json.loads(self.store.get(key))


def connect(world: World, timeout_s: float = DEFAULT_TIMEOUT_S) -> Exchange:
    """The exchange of this launch, over torchrun's store.

    Raises:
        LeversError: MASTER_ADDR or MASTER_PORT is unset (not launched by torchrun).
    """
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port:
        raise LeversError(
            f"WORLD_SIZE={world.world_size} but MASTER_ADDR or MASTER_PORT is not set; launch "
            f"with torchrun --nproc_per_node={world.world_size} -m levers ..."
        )
    timeout = timedelta(seconds=timeout_s)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" and not dist.is_initialized():
        # no store server yet: the default group's env:// rendezvous starts one on rank 0
        dist.init_process_group(
            "gloo",
            init_method="env://",
            rank=world.rank,
            world_size=world.world_size,
            timeout=timeout,
        )
    store = dist.TCPStore(host, int(port), is_master=False, timeout=timeout)
    # a restarted launch (torchrun --max-restarts) must not read the previous attempt's keys
    prefix = "levers/{}/{}".format(
        os.environ.get("TORCHELASTIC_RUN_ID", "run"),
        os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"),
    )
    return Exchange(world=world, store=dist.PrefixStore(prefix, store), timeout_s=timeout_s)
