"""CUDA autocast on the CPU stand-in tensors.

Under ``torch.autocast("cuda")`` a GPU run casts per op by CUDA's lists: matmuls and
convolutions to the low-precision dtype, norms, softmax, exp, pow, losses and reductions to
float32, a few ops to the widest input type. CPU autocast has different lists (it leaves
``layer_norm``, ``softmax``, ``pow`` and ``sum`` alone, for one), and those casts decide the
dtype, hence the size, of most activations. So while a prediction runs:

- ``torch.autocast("cuda", ...)`` turns on the *CPU* autocast state (which is the one that the
  stand-in tensors consult) with the same dtype, and
- the ``AutocastCPU`` dispatch key gets Python kernels that apply CUDA's policy to each op that
  CUDA's autocast handles, and falls through for ops that only CPU autocast handles.

The kernels run above autograd, as the C++ ones do, so every cast is recorded in the graph and
the cast copies that backward needs are kept alive exactly as on a GPU. Casts of leaf float32
tensors that require grad (the weights) are cached for the life of the autocast region, like
``cached_cast``.

The lists are torch's ``AT_FORALL_LOWER_PRECISION_FP``, ``AT_FORALL_FP32``,
``AT_FORALL_FP32_SET_OPT_DTYPE`` and ``AT_FORALL_PROMOTE`` (``ATen/autocast_mode.h``).
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._pytree import tree_map

from levers.memory import compiled

LOWER_PRECISION = (
    "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc",
    "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution",
    "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot",
    "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot",
    "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell",
    "rnn_relu_cell", "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
    "cudnn_convolution", "cudnn_convolution_transpose",
)  # fmt: skip
FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar",
    "softplus", "layer_norm", "native_layer_norm", "rms_norm", "group_norm", "frobenius_norm.dim",
    "nuclear_norm", "nuclear_norm.dim", "cosine_similarity", "poisson_nll_loss",
    "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div",
    "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss",
    "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d",
    "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d",
    "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa",
    "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
)  # fmt: skip
FP32_SET_OPT_DTYPE = (
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum",
    "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum",
    "sum.dim_IntList",
)  # fmt: skip
FP32_APPEND_DTYPE = ("norm.Scalar", "norm.ScalarOpt_dim")
PROMOTE = (
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
    "index_put", "tensordot", "scatter_add",
)  # fmt: skip
BANNED = ("binary_cross_entropy",)

_KEY = "AutocastCPU"
_EXCLUDE = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)


def _op(name: str) -> torch._ops.OpOverload:
    base, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, base), overload or "default")


def _eligible(value: Any) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.is_floating_point()
        and value.dtype != torch.float64
    )


class _CastCache:
    """Low-precision copies of float32 leaf tensors that require grad, per autocast region."""

    def __init__(self) -> None:
        self._copies: dict[int, tuple[weakref.ref, torch.Tensor]] = {}

    def cast(self, value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if value.dtype == dtype:
            return value
        cacheable = (
            dtype == torch.get_autocast_dtype("cpu")
            and value.dtype == torch.float32
            and value.requires_grad
            and value.is_leaf
            and not value._is_view()
            and torch.is_autocast_cache_enabled()
        )
        if not cacheable:
            return value.to(dtype)
        entry = self._copies.get(id(value))
        if entry is not None and entry[0]() is value:
            return entry[1]
        copy = value.to(dtype)
        self._copies[id(value)] = (weakref.ref(value), copy)
        return copy

    def clear(self) -> None:
        self._copies.clear()


def _cast_all(args: Any, kwargs: dict, dtype: torch.dtype, cache: _CastCache) -> tuple:
    def cast(value: Any) -> Any:
        return cache.cast(value, dtype) if _eligible(value) else value

    return tree_map(cast, args), tree_map(cast, kwargs)


def _make_kernel(op: torch._ops.OpOverload, policy: str, cache: _CastCache):
    def kernel(*args: Any, **kwargs: Any) -> Any:
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            if policy == "lower":
                args, kwargs = _cast_all(args, kwargs, torch.get_autocast_dtype("cpu"), cache)
            elif policy == "fp32":
                args, kwargs = _cast_all(args, kwargs, torch.float32, cache)
            elif policy == "set_opt_dtype":
                if _eligible(args[0]):
                    args, kwargs = _default_dtype(op, args, kwargs, torch.float32)
            elif policy == "append_dtype":
                if _eligible(args[0]):
                    return _append_dtype(op, args, kwargs)
            elif policy == "promote":
                dtypes = [a.dtype for a in _flat_tensors(args, kwargs) if _eligible(a)]
                if dtypes:
                    widest = dtypes[0]
                    for dtype in dtypes[1:]:
                        widest = torch.promote_types(widest, dtype)
                    args, kwargs = _cast_all(args, kwargs, widest, cache)
            elif policy == "banned":
                raise RuntimeError(
                    f"{op} is unsafe to autocast (CUDA autocast refuses it); use the "
                    "_with_logits variant, as a GPU run would have to"
                )
            return op(*args, **kwargs)

    return kernel


def _default_dtype(op: torch._ops.OpOverload, args: tuple, kwargs: dict, dtype: torch.dtype):
    """Set the op's ``dtype`` argument to ``dtype`` unless the caller gave one."""
    names = [argument.name for argument in op._schema.arguments]
    position = names.index("dtype")
    if position < len(args):
        if args[position] is None:
            args = (*args[:position], dtype, *args[position + 1 :])
        return args, kwargs
    if kwargs.get("dtype") is None:
        kwargs = {**kwargs, "dtype": dtype}
    return args, kwargs


def _append_dtype(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    # norm.Scalar and norm.ScalarOpt_dim redispatch to the sibling overload that takes a dtype
    names = [argument.name for argument in op._schema.arguments]
    values = {
        name: argument.default_value
        for name, argument in zip(names, op._schema.arguments)
        if argument.has_default_value()
    }
    values.update(zip(names, args))
    values.update(kwargs)
    if "dim" in names:
        return torch.ops.aten.norm.ScalarOpt_dim_dtype(
            values["self"],
            values["p"],
            values["dim"],
            values.get("keepdim", False),
            dtype=torch.float32,
        )
    return torch.ops.aten.norm.ScalarOpt_dtype(
        values["self"], values.get("p", 2), dtype=torch.float32
    )


def _flat_tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []

    def visit(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            found.append(value)
        return value

    tree_map(visit, (args, kwargs))
    return found


def _policies() -> dict[str, str]:
    """The policy of every op that this torch's CUDA autocast handles.

    The lists change between torch versions (``rms_norm`` joined the float32 list after 2.11),
    so an op counts only if this torch registers a CUDA autocast kernel for it: the prediction
    follows the torch it runs with.
    """
    table: dict[str, str] = {}
    for names, policy in (
        (LOWER_PRECISION, "lower"),
        (FP32, "fp32"),
        (FP32_SET_OPT_DTYPE, "set_opt_dtype"),
        (FP32_APPEND_DTYPE, "append_dtype"),
        (PROMOTE, "promote"),
        (BANNED, "banned"),
    ):
        for name in names:
            if torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "AutocastCUDA"):
                table[name] = policy
    return table


def _cpu_only_ops(cuda_ops: set[str]) -> list[str]:
    """Ops that CPU autocast handles and CUDA autocast does not."""
    names = []
    for qualified in torch._C._dispatch_get_all_op_names():
        if not qualified.startswith("aten::"):
            continue
        if not torch._C._dispatch_has_kernel_for_dispatch_key(qualified, _KEY):
            continue
        name = qualified.removeprefix("aten::")
        if name not in cuda_ops:
            names.append(name)
    return names


@contextlib.contextmanager
def cuda_autocast_policy() -> Iterator[None]:
    """Apply CUDA's autocast policy to CPU tensors, and let ``torch.autocast("cuda")`` turn it
    on. Undone on exit (the kernels are deregistered, the class is restored)."""
    cache = _CastCache()
    library = torch.library.Library("aten", "IMPL")
    policies = _policies()
    with warnings.catch_warnings():
        # overriding the C++ AutocastCPU kernels is the point; torch warns about each one
        warnings.simplefilter("ignore")
        for name, policy in policies.items():
            try:
                op = _op(name)
            except AttributeError:  # an op this torch does not have
                continue
            library.impl(name, _make_kernel(op, policy, cache), _KEY)
        for name in _cpu_only_ops(set(policies)):
            library.impl(name, torch.library.fallthrough_kernel, _KEY)
    try:
        with _cuda_autocast_on_cpu(cache):
            yield
    finally:
        library._destroy()
        cache.clear()
        compiled.forget_dispatch_caches()


@contextlib.contextmanager
def _cuda_autocast_on_cpu(cache: _CastCache) -> Iterator[None]:
    autocast_cls = torch.amp.autocast_mode.autocast
    original_init = autocast_cls.__init__
    original_clear = torch.clear_autocast_cache

    def __init__(
        self, device_type: str, dtype: Any = None, enabled: bool = True, cache_enabled: Any = None
    ):
        if device_type == "cuda":
            # CUDA autocast defaults to float16 when no dtype is given
            dtype = dtype if dtype is not None else torch.float16
            device_type = "cpu"
        original_init(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    def clear_autocast_cache() -> None:
        cache.clear()
        original_clear()

    autocast_cls.__init__ = __init__
    torch.clear_autocast_cache = clear_autocast_cache
    try:
        yield
    finally:
        autocast_cls.__init__ = original_init
        torch.clear_autocast_cache = original_clear
