"""This process's place in a torchrun launch, from the environment torchrun sets."""

from __future__ import annotations

import os
from dataclasses import dataclass

from levers.errors import LeversError


@dataclass(frozen=True)
class World:
    rank: int
    world_size: int
    local_rank: int

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_leader(self) -> bool:
        return self.rank == 0


def _int(env: dict[str, str], name: str, default: int) -> int:
    text = env.get(name)
    if text is None or text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise LeversError(
            f"environment variable {name}={text!r} is not an integer; launch levers with "
            "torchrun, which sets RANK, WORLD_SIZE and LOCAL_RANK"
        ) from None


def world_from_env(env: dict[str, str] | None = None) -> World:
    """RANK, WORLD_SIZE and LOCAL_RANK (a single process when they are unset).

    Raises:
        LeversError: a value that is not an integer, or a rank outside the world.
    """
    env = dict(os.environ) if env is None else env
    world_size = _int(env, "WORLD_SIZE", 1)
    rank = _int(env, "RANK", 0)
    local_rank = _int(env, "LOCAL_RANK", rank)
    if world_size < 1 or not 0 <= rank < world_size:
        raise LeversError(
            f"RANK={rank} is not inside WORLD_SIZE={world_size}; launch levers with torchrun"
        )
    return World(rank=rank, world_size=world_size, local_rank=local_rank)
