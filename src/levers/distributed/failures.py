"""What a rank's failure becomes on the command line: shared by the distributed audit and A/B."""

from __future__ import annotations

from levers.distributed.world import World
from levers.errors import LeversError, StepError


class RanksFailed(LeversError):
    """Some rank raised, hung or died; the message names each."""

    exit_code = 3


def rank_error(world: World, exc: BaseException) -> BaseException:
    """This rank's own error, its message prefixed with the rank."""
    if isinstance(exc, LeversError):
        kind = StepError if isinstance(exc, StepError) else LeversError
        renamed = kind(f"rank {world.rank}: {exc}", user_traceback=exc.user_traceback)
        renamed.exit_code = exc.exit_code
        return renamed
    return exc
