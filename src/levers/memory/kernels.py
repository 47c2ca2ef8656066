"""Memory that GPU kernels take from the caching allocator beyond their outputs.

A fake (meta) kernel allocates only the outputs. On a GPU some ops also take buffers from the
caching allocator, which count in ``memory_allocated`` like any tensor:

- cuBLAS keeps one workspace per (handle, stream), and a handle per thread: one for the
  forward and optimizer (the main thread), one for backward (the autograd device thread). They
  are allocated at the first matmul on each thread and kept for the life of the process.
- Flash attention's backward (FlashAttention-2 ``mha_bwd``) allocates ``softmax_d`` [B, H,
  Lq rounded to 128] and, when the keys do not fit one tile, a float32 ``dq_accum`` [B, Lq
  rounded to 128, H, head dim rounded to 32]; with grouped-query attention it also allocates
  ``dk_expanded`` and ``dv_expanded`` with all the query heads. They live for the kernel.
- cuDNN attention's backward (the backend SDPA tries first on Hopper) takes a workspace of a
  float32 ``dq`` accumulator [B, H, Lq, E], a float32 [B, H, Lq] row sum and 512 bytes, and,
  with grouped-query attention, ``dk`` and ``dv`` expanded to all the query heads in the input
  dtype; they live for the kernel. (These sizes reproduce the H200 probe of torch 2.11 with
  cuDNN 9.19 byte for byte: ``attention_memory`` in ``bench/results/memory_calibration_h200``.)
- Memory-efficient attention's backward allocates ``delta`` [B, H, Lq] in float32 and, for a
  head dim above 64 in half precision, a float32 accumulator for ``grad_q``.
- Embedding backward sorts the indices: two int64 buffers of the number of indices.
- A reduction (``sum``, ``mean``, ``prod``, a vector norm) that splits each output's inputs across
  thread blocks sums the blocks' partial results in a float32 buffer of ``num_outputs x blocks
  per output (x the block's width and output vector size when the block does not reduce along
  x)`` plus one int per block column: the sizes ``setReduceConfig`` in ``Reduce.cuh`` picks from
  the shape, the strides and the GPU's SM count. The bias gradient of a linear layer (``sum``
  over the tokens of a ``[tokens, features]`` gradient) takes such a buffer: 132 MiB for 12,608
  tokens x 3,072 features in bf16 on an H200, as measured.
- cuDNN's half-precision convolutions of NCHW tensors run on NHWC kernels: the forward takes a
  workspace of the input in NHWC (channels padded to a multiple of 8) and the output in NHWC;
  in backward the data gradient's call takes the output gradient and the input
  gradient in NHWC, then the weight gradient's call the output gradient and the input. A 1x1
  convolution of stride 1 on a map of 28x28 or more is a plain matrix product on the NCHW
  tensors and takes none. (An empirical model, from the allocator's trace on an H200 with
  torch 2.11 and cuDNN 9, for ResNet-50 and ViT-B/16's patch embedding at batch 32-128: the
  copies are the bulk of each call's workspace, and the algorithm's own part, left out, adds
  0-16% or up to 7 MiB; 3x3 convolutions on 14x14 and 7x7 maps take up to 2.5 times the copies,
  and the backward of 1x1 convolutions on large maps a power-of-two buffer of up to 64 MiB,
  also left out. Float32 convolutions, channels-last tensors and grouped convolutions are not
  modelled.)

Sizes of workspaces that vary with the library version (the cuBLAS workspace) come from the
calibration on an H200 with torch 2.11 (``bench/results/memory_calibration*``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

MIB = 1 << 20

_MATMULS = {
    "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::addmv",
    "aten::mv", "aten::dot", "aten::_addmm_activation",
}  # fmt: skip


@dataclass(frozen=True)
class KernelModel:
    """Workspace sizes of a target: the cuBLAS workspace depends on the chip."""

    cublas_workspace_bytes: int
    # cuBLASLt (addmm with a bias epilogue) keeps its own 1 MiB workspace per thread
    cublaslt_workspace_bytes: int = 1 << 20

    # the GPU's SM count and threads per SM: the grid a reduction's buffer is sized by
    num_sms: int = 132
    max_threads_per_sm: int = 2048

    @staticmethod
    def for_sm(sm: tuple[int, int], num_sms: int = 132, max_threads_per_sm: int = 2048
               ) -> KernelModel:
        # CUBLAS_WORKSPACE_CONFIG's default: ":4096:8" on sm90, ":4096:2:16:8" elsewhere
        cublas = 4096 * 8 * 1024 if sm == (9, 0) else 4096 * 1024 * 2 + 16 * 1024 * 8
        return KernelModel(cublas_workspace_bytes=cublas, num_sms=num_sms,
                           max_threads_per_sm=max_threads_per_sm)

    @staticmethod
    def for_gpu(gpu: Any) -> KernelModel:
        """The model of a :class:`levers.hardware.GpuSpec`."""
        return KernelModel.for_sm(gpu.sm, gpu.num_sms, gpu.max_threads_per_sm)


@dataclass(frozen=True)
class Workspace:
    nbytes: int
    persistent: bool
    label: str


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def workspaces(
    model: KernelModel, func, args: tuple, out: Any, thread: str, seen: set,
    kwargs: dict | None = None,
) -> list[Workspace]:
    """The buffers ``func`` takes besides its outputs, in allocation order.

    ``thread`` is "main" or "autograd"; ``seen`` holds the (library, thread) pairs that already
    own a workspace (updated here).
    """
    name = func._schema.name
    found: list[Workspace] = []
    if name in _REDUCTIONS:
        found.extend(_reduction_buffers(model, func, args, kwargs or {}))
    elif name == "aten::convolution" or name == "aten::convolution_backward":
        found.extend(_convolution_workspace(name, args))
    if name in _MATMULS and ("cublas", thread) not in seen:
        seen.add(("cublas", thread))
        found.append(Workspace(model.cublas_workspace_bytes, True, "cuBLAS workspace"))
    if name == "aten::addmm" and ("cublaslt", thread) not in seen and _lt_eligible(args):
        seen.add(("cublaslt", thread))
        found.append(Workspace(model.cublaslt_workspace_bytes, True, "cuBLASLt workspace"))
    if name == "aten::_scaled_dot_product_flash_attention_backward":
        found.extend(_flash_backward(args))
    elif name == "aten::_scaled_dot_product_cudnn_attention_backward":
        found.extend(_cudnn_backward(args))
    elif name == "aten::_scaled_dot_product_efficient_attention_backward":
        found.extend(_efficient_backward(args))
    elif name == "aten::embedding_dense_backward":
        num_indices = args[1].numel()
        found.append(Workspace(num_indices * 8, False, "embedding backward sort"))
        found.append(Workspace(num_indices * 8, False, "embedding backward sort"))
    return found


def _lt_eligible(args: tuple) -> bool:
    # addmm goes through cublasLt's bias epilogue when the bias is a vector over the columns
    bias = args[0] if args else None
    return isinstance(bias, torch.Tensor) and bias.dim() == 1


def _flash_backward(args: tuple) -> list[Workspace]:
    # grad_out, query, key, value, out, logsumexp, ... in [B, H, L, E]
    query, key = args[1], args[2]
    batch, heads, q_len, head_dim = query.shape
    kv_heads, k_len = key.shape[1], key.shape[2]
    q_rounded = _round_up(q_len, 128)
    found = [Workspace(batch * heads * q_rounded * 4, False, "flash softmax_d")]
    block_n = 128 if head_dim > 64 else 256
    if k_len > block_n:
        dim_rounded = _round_up(head_dim, 32) if head_dim <= 192 else 256
        found.append(
            Workspace(batch * q_rounded * heads * dim_rounded * 4, False, "flash dq_accum")
        )
    if kv_heads != heads:
        itemsize = query.element_size()
        expanded = batch * k_len * heads * head_dim * itemsize
        found.append(Workspace(expanded, False, "flash dk_expanded"))
        found.append(Workspace(expanded, False, "flash dv_expanded"))
    return found


def _cudnn_backward(args: tuple) -> list[Workspace]:
    # grad_out, query, key, value, out, logsumexp, ... in [B, H, L, E]
    query, key, value = args[1], args[2], args[3]
    batch, heads, q_len, head_dim = query.shape
    kv_heads, k_len = key.shape[1], key.shape[2]
    found = [
        Workspace(batch * heads * q_len * head_dim * 4, False, "cuDNN attention dq accumulator"),
        Workspace(batch * heads * q_len * 4, False, "cuDNN attention row sum"),
        Workspace(512, False, "cuDNN attention workspace"),
    ]
    if kv_heads != heads:
        itemsize = query.element_size()
        found.append(
            Workspace(batch * heads * k_len * head_dim * itemsize, False, "cuDNN dk_expanded")
        )
        found.append(
            Workspace(
                batch * heads * k_len * value.shape[-1] * itemsize, False, "cuDNN dv_expanded"
            )
        )
    return found


def _efficient_backward(args: tuple) -> list[Workspace]:
    query = args[1]
    batch, heads, q_len, head_dim = query.shape
    found = [Workspace(batch * heads * q_len * 4, False, "efficient delta")]
    if query.dtype in (torch.float16, torch.bfloat16) and head_dim > 64:
        found.append(
            Workspace(batch * heads * q_len * head_dim * 4, False, "efficient grad_q accumulator")
        )
    return found


# --- reductions (Reduce.cuh) ---------------------------------------------------------------------

# the reductions that accumulate in float32 for half-precision inputs (max and min accumulate in
# the input's own type, which this model does not cover)
_REDUCTIONS = {
    "aten::sum", "aten::mean", "aten::nansum", "aten::prod", "aten::linalg_vector_norm",
}  # fmt: skip
# the ops whose buffers are booked only when they run on the GPU (the older entries keep their
# behaviour: they are booked wherever the op runs)
GPU_ONLY = _REDUCTIONS | {"aten::convolution", "aten::convolution_backward"}
_MAX_THREADS = 512  # a reduction block's most threads (256 for complex double, not modelled)
_MIN_VALUES_PER_THREAD = 16
_MAX_VALUES_PER_THREAD = 256
_WARP = 32


def _last_pow2(n: int) -> int:
    return max(1, 1 << (max(int(n), 1).bit_length() - 1))


def _div_up(a: int, b: int) -> int:
    return -(-a // b)


def _reduced_dims(func, args: tuple, kwargs: dict, ndim: int) -> list[int] | None:
    """The dimensions ``func`` reduces (all of them when its schema takes no ``dim`` or it is
    empty), or None when they cannot be read."""
    names = [a.name for a in func._schema.arguments]
    if "dim" not in names:
        return list(range(ndim))  # sum.default, mean.default, prod.default
    position = names.index("dim")
    dims = kwargs["dim"] if "dim" in kwargs else (args[position] if len(args) > position else None)
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    try:
        return sorted({int(d) % ndim for d in dims})
    except (TypeError, ValueError):
        return None


def _reduction_buffers(model: KernelModel, func, args: tuple, kwargs: dict) -> list[Workspace]:
    """The cross-block buffer and semaphores of a CUDA reduction, as ``setReduceConfig`` sizes
    them; none when the reduction fits within blocks."""
    source = args[0] if args else None
    if not isinstance(source, torch.Tensor) or source.dim() == 0 or source.numel() == 0:
        return []
    if not source.dtype.is_floating_point:
        return []
    reduced = _reduced_dims(func, args, kwargs, source.dim())
    if reduced is None:
        return []
    config = _reduce_config(
        source.shape, source.stride(), set(reduced),
        acc_size=8 if source.dtype == torch.float64 else 4,
        num_sms=model.num_sms, max_threads_per_sm=model.max_threads_per_sm,
    )
    if config is None:
        return []
    buffer_bytes, semaphore_bytes = config
    return [
        Workspace(buffer_bytes, False, "reduction buffer"),
        Workspace(semaphore_bytes, False, "reduction semaphores"),
    ]


def _iterator_dims(shape, strides, reduced: set[int]) -> list[tuple[int, int, bool]]:
    """The (size, input stride, reduced) of TensorIterator's dimensions: size-1 dimensions
    dropped, reduced dimensions first, each group fastest-moving first, then adjacent
    dimensions that are contiguous in the input coalesced."""
    dims = [(int(shape[d]), int(strides[d]), d in reduced) for d in range(len(shape))
            if int(shape[d]) != 1]
    # reduced dims to the front; within a group by input stride, ties keep the inner dim first
    order = sorted(range(len(dims)), key=lambda i: (not dims[i][2], dims[i][1], -i))
    dims = [dims[i] for i in order]
    merged: list[list] = []
    for size, stride, is_reduced in dims:
        if merged:
            last = merged[-1]
            if last[2] == is_reduced and stride == last[0] * last[1]:
                last[0] *= size
                continue
        merged.append([size, stride, is_reduced])
    return [tuple(d) for d in merged]


def _reduce_config(
    shape, strides, reduced: set[int], *, acc_size: int, num_sms: int, max_threads_per_sm: int,
) -> tuple[int, int] | None:
    """(global buffer bytes, semaphore bytes) of a reduction, or None when it needs none.
    ``strides`` are in elements."""
    dims = _iterator_dims(shape, strides, reduced)
    num_reduce_dims = sum(1 for d in dims if d[2])
    num_outputs = 1
    inputs_per_output = 1
    for size, _, is_reduced in dims:
        if is_reduced:
            inputs_per_output *= size
        else:
            num_outputs *= size
    if inputs_per_output <= 1:  # also when every dimension has size 1
        return None
    on_fastest = num_reduce_dims == len(dims) or dims[0][1] < dims[num_reduce_dims][1]
    output_vec_size = 1
    if on_fastest:
        dim0, dim1 = inputs_per_output, num_outputs
        fastest_stride = dims[0][1]
    else:
        dim0, dim1 = num_outputs, inputs_per_output
        fastest_stride = dims[num_reduce_dims][1]
    if fastest_stride == 1:
        if on_fastest and dim0 > 128 and num_reduce_dims == 1:
            dim0 //= 4  # vectorised input loads
        elif not on_fastest:
            output_vec_size = 4
            for n in [dims[num_reduce_dims][0]] + [
                d[1] for i, d in enumerate(dims) if i != num_reduce_dims
            ]:
                while n % output_vec_size:
                    output_vec_size //= 2
            dim0 //= output_vec_size
    max_threads = _MAX_THREADS // output_vec_size
    dim0_pow2 = _last_pow2(dim0) if dim0 < max_threads else max_threads
    dim1_pow2 = _last_pow2(dim1) if dim1 < max_threads else max_threads
    block_width = min(dim0_pow2, _WARP)
    block_height = min(dim1_pow2, max_threads // block_width)
    block_width = min(dim0_pow2, max_threads // block_height)
    num_threads = block_width * block_height
    step_input = step_output = 1
    block_x_reduce = block_y_reduce = False
    if on_fastest:
        block_x_reduce = True
        step_input *= block_width
    else:
        step_output *= block_width
    values_per_thread = _div_up(inputs_per_output, step_input)
    if values_per_thread >= block_height * 16 or values_per_thread >= _MAX_VALUES_PER_THREAD:
        block_y_reduce = True
        step_input *= block_height
    else:
        step_output *= block_height
    target_grid = num_sms * (max_threads_per_sm // num_threads)
    grid_x = _div_up(num_outputs // output_vec_size, step_output)
    values_per_thread = _div_up(inputs_per_output, step_input)
    if not (block_y_reduce and values_per_thread >= _MAX_VALUES_PER_THREAD
            and grid_x <= target_grid):
        return None
    ctas_per_output = max(
        min(_div_up(target_grid, grid_x), _div_up(values_per_thread, _MIN_VALUES_PER_THREAD)),
        _div_up(values_per_thread, _MAX_VALUES_PER_THREAD),
    )
    if ctas_per_output <= 1:
        return None
    buffer = acc_size * num_outputs * ctas_per_output
    if not block_x_reduce:
        buffer *= block_width * output_vec_size
    return buffer, 4 * grid_x


# --- cuDNN convolutions ----------------------------------------------------------------------------

_HALF = (torch.float16, torch.bfloat16)
# a 1x1, stride-1 convolution on a map of at least this many pixels runs on the NCHW tensors as
# they are (the H200 measured none at 28x28 and 56x56, the NHWC copies at 14x14 and 7x7)
_POINTWISE_IN_PLACE_MAP = 28 * 28


def _nhwc_bytes(t: torch.Tensor, pad_channels: bool) -> int:
    n, c, *spatial = t.shape
    if pad_channels:
        c = _round_up(c, 8)
    count = n * c
    for s in spatial:
        count *= s
    return count * t.element_size()


def _per_dim(values: Any) -> tuple[int, int]:
    """A 2-d convolution's stride, padding or dilation for each of its two spatial dims."""
    values = tuple(values) if isinstance(values, (list, tuple)) else (values,)
    return (values[0], values[0]) if len(values) == 1 else (values[0], values[1])


def _convolution_workspace(name: str, args: tuple) -> list[Workspace]:
    """cuDNN's NHWC copies of a half-precision NCHW 2-d convolution, one workspace per cuDNN
    call: the forward's of input and output; in backward, the input gradient's (data grad) of
    output gradient and input gradient, then the weight gradient's of output gradient and input
    (see the module docstring)."""
    if name == "aten::convolution":
        x, weight = args[0], args[1]
        stride, padding, dilation, transposed, groups = args[3], args[4], args[5], args[6], args[8]
        grad_out, mask = None, None
    else:
        grad_out, x, weight = args[0], args[1], args[2]
        stride, padding, dilation = args[4], args[5], args[6]
        transposed, groups = args[7], args[9]
        mask = args[10] if len(args) > 10 else (True, True, True)
    # an int[] of one value stands for every spatial dimension (EfficientNet's convolutions)
    stride, padding, dilation = _per_dim(stride), _per_dim(padding), _per_dim(dilation)
    if not all(isinstance(t, torch.Tensor) for t in (x, weight)) or x.dim() != 4:
        return []
    if x.dtype not in _HALF or transposed or groups != 1:
        return []
    if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
        return []
    kernel = tuple(weight.shape[2:])
    pointwise = kernel == (1, 1) and all(s == 1 for s in stride) and all(p == 0 for p in padding)
    if pointwise and x.shape[2] * x.shape[3] >= _POINTWISE_IN_PLACE_MAP:
        return []  # a plain matrix product on the NCHW tensors
    input_bytes = _nhwc_bytes(x, pad_channels=True)
    if grad_out is None:
        n, _, h, w = x.shape
        out_h = (h + 2 * padding[0] - dilation[0] * (kernel[0] - 1) - 1) // stride[0] + 1
        out_w = (w + 2 * padding[1] - dilation[1] * (kernel[1] - 1) - 1) // stride[1] + 1
        output_bytes = n * weight.shape[0] * out_h * out_w * x.element_size()
        return [Workspace(input_bytes + output_bytes, False, "cuDNN convolution NHWC workspace")]
    grad_out_bytes = _nhwc_bytes(grad_out, pad_channels=False)
    found = []
    if mask[0]:
        found.append(Workspace(grad_out_bytes + _nhwc_bytes(x, pad_channels=False), False,
                               "cuDNN convolution data-grad NHWC workspace"))
    if mask[1]:
        found.append(Workspace(grad_out_bytes + input_bytes, False,
                               "cuDNN convolution weight-grad NHWC workspace"))
    return found
