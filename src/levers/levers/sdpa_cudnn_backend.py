"""``sdpa-cudnn-backend``: let every SDPA call of the model reach a fused backend.

A pin (``sdpa_kernel([...])`` without cuDNN, or backend flags turned off) and a call that only some
fused backends accept (a dense mask with ``enable_gqa``: FLASH takes no mask, EFFICIENT no GQA on
torch 2.11-2.13) leave SDPA on MATH. While the model's forward runs, this lever runs each
``F.scaled_dot_product_attention`` call under a pin that admits cuDNN, FLASH, EFFICIENT and MATH in
that priority, inside whatever pin the code set; a square causal mask (tril of True, or 0 on and
below the diagonal and -inf above) becomes ``is_causal=True``, which FLASH accepts.

Found by pattern: the model's code calls SDPA (its module sources name it, or a Hugging Face
config selects ``sdpa``). Process-wide state is touched only for the duration of each call.

Fix safety: changes numerics on a GPU (a fused kernel accumulates in another order than MATH); on
a CPU the backend choice does not change the result. Tolerance checked: 1e-5 relative in fp32.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.overrides import TorchFunctionMode

from levers.levers import register
from levers.levers._find import hf_configs, source_mentions
from levers.levers._patch import Undos
from levers.levers.lever import Lever, Target
from levers.vocab import CHANGES_NUMERICS

ADMIT_FUSED = [
    SDPBackend.CUDNN_ATTENTION,
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.MATH,
]
MARK = "_levers_sdpa_admit_fused"


def is_causal_mask(mask: torch.Tensor, len_q: int, len_k: int) -> bool:
    """Whether ``mask`` is the square top-left causal mask, the same for every batch and head."""
    if len_q != len_k or mask.dim() < 2 or tuple(mask.shape[-2:]) != (len_q, len_k):
        return False
    if any(size != 1 for size in mask.shape[:-2]):
        return False
    square = mask.reshape(len_q, len_k)
    below = torch.ones(len_q, len_k, dtype=torch.bool, device=mask.device).tril()
    if mask.dtype == torch.bool:
        return bool(torch.equal(square, below))  # sync point: once per distinct mask
    ok = (square == 0) & below | (square == float("-inf")) & ~below
    return bool(ok.all())  # sync point: once per distinct mask


class AdmitFused(TorchFunctionMode):
    """Runs SDPA calls under :data:`ADMIT_FUSED`; causal masks become ``is_causal``."""

    def __init__(self) -> None:
        super().__init__()
        self._causal: dict[tuple, bool] = {}

    def _mask_is_causal(self, mask: torch.Tensor, len_q: int, len_k: int) -> bool:
        key = (mask.data_ptr(), mask._version, tuple(mask.shape), mask.dtype, mask.device)
        if key not in self._causal:
            if len(self._causal) > 64:
                self._causal.clear()
            self._causal[key] = is_causal_mask(mask, len_q, len_k)
        return self._causal[key]

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
        bound = dict(zip(names, args))
        bound.update(kwargs)
        mask = bound.get("attn_mask")
        # under torch.compile the mask's values are not known while tracing: leave it
        tracing = torch.compiler.is_compiling()
        if isinstance(mask, torch.Tensor) and not bound.get("is_causal", False) and not tracing:
            len_q, len_k = bound["query"].shape[-2], bound["key"].shape[-2]
            if self._mask_is_causal(mask, len_q, len_k):
                bound["attn_mask"], bound["is_causal"] = None, True
        query, key, value = bound.pop("query"), bound.pop("key"), bound.pop("value")
        with sdpa_kernel(ADMIT_FUSED, set_priority=True):
            return func(query, key, value, **bound)


def _calls_sdpa(target: Target) -> bool:
    configs = hf_configs(target.model)
    if configs:
        return any(c._attn_implementation == "sdpa" for c in configs)
    return source_mentions(target.model, "scaled_dot_product_attention")


def applies(target: Target) -> str | None:
    if getattr(target.model, MARK, False):
        return "already applied to this model"
    if not _calls_sdpa(target):
        return (
            "the model's code does not call F.scaled_dot_product_attention (for eager attention "
            "use sdpa-attention first)"
        )
    return None


def patch(target: Target) -> Callable[[], None]:
    model = target.model
    mode = AdmitFused()
    original = model.forward

    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        with mode:
            return original(*args, **kwargs)

    undos = Undos()
    undos.set_attr(model, "forward", forward)
    undos.set_attr(model, MARK, True)
    return undos


LEVER = register(
    Lever(
        id="sdpa-cudnn-backend",
        title="Admit cuDNN and the other fused SDPA backends where a pin or the call left MATH",
        safety=CHANGES_NUMERICS,
        tolerance=1e-5,
        fixes=("ATTN001",),
        applies=applies,
        patch=patch,
        needs_gpu=True,
        known_problems=(
            "the mode wraps the model's forward; under a whole-model torch.compile it is traced "
            "by dynamo (not measured). Lower-right causal masks (Lq != Lk) stay dense."
        ),
    )
)
