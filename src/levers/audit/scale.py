"""What the scale rules (DIST*) share: the capture's distribution settings and a receipt.

The collectives run inside autograd's engine and carry no user source line, so a scale
finding's receipt is the first line of user code that the wrapped model's forward ran (the
model's own ``forward``, or the step's call of a model built of torch modules): the model
whose DDP or FSDP2 wrapper the fix changes.
"""

from __future__ import annotations

from typing import Any

from levers.audit.finding import Receipt
from levers.capture.records import Capture


def distributed(capture: Capture) -> dict[str, Any]:
    return dict(capture.settings.get("distributed") or {})


def ddp_settings(capture: Capture) -> dict[str, Any] | None:
    """The DDP wrapper's settings (bucket_cap_mb, find_unused_parameters, ...), or None."""
    return distributed(capture).get("ddp")


def world_size(capture: Capture) -> int:
    info = distributed(capture)
    ddp = info.get("ddp") or {}
    return int(max(info.get("world_size") or 1, ddp.get("world_size") or 1))


def model_call_receipt(capture: Capture, *, op: str, shapes: str, count: int = 1) -> Receipt:
    source = next(
        (o.source for o in capture.ops if o.phase == "forward" and o.source is not None), None
    )
    return Receipt(
        file=source.file if source else "<unknown>",
        line=source.line if source else 0,
        code=source.code if source else "",
        module=None,
        op=op,
        shapes=shapes,
        count=count,
    )
