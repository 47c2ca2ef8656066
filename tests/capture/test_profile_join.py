"""Joining the profiler's events to the recorded ops: allocator bytes after each op, op ranges,
and the per-op caches of the recorder (they must give what an uncached reading gives)."""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from levers.capture import gpu
from levers.capture.ops import MetaCache, meta_of, nbytes, op_flops, op_info, schema_kind

_CPU = torch.device("cpu")


def test_allocated_bytes_after_each_op_from_the_profilers_memory_events():
    marker = gpu.range_marker()
    before = torch.ones(8)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with marker(0):
            view = before.view(2, 4)  # allocates nothing, and no allocator event came before it
        with marker(1):
            a = torch.empty(1000)  # 4000 bytes
        with marker(2):
            b = torch.empty(500)  # 2000 bytes
        with marker(3):
            del a
            c = torch.empty(10)  # freed 4000, allocated 40
        with marker(4):
            view = b.view(-1)  # nothing
    joined = gpu.read_profile(prof)
    assert sorted(joined.end_ns) == [0, 1, 2, 3, 4]
    assert joined.kernels == [] and joined.device_us == {}
    after = gpu.allocated_after_ops(prof, _CPU, joined.end_ns, num_ops=5, start_bytes=12345)
    assert after[0] == 12345
    assert [x - after[1] for x in after[1:]] == [0, 2000, 2000 - 4000 + 40, 2000 - 4000 + 40]
    del b, c, view


def test_an_op_without_a_range_keeps_the_previous_figure():
    marker = gpu.range_marker()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with marker(0):
            a = torch.empty(100)
        b = torch.empty(100)  # outside every range: only seen at the next range's end
        with marker(2):
            pass
    joined = gpu.read_profile(prof)
    after = gpu.allocated_after_ops(prof, _CPU, joined.end_ns, num_ops=3, start_bytes=0)
    assert after[1] == after[0] and after[2] == after[0] + 400
    del a, b


def test_meta_cache_gives_what_meta_of_gives():
    cache = MetaCache()
    tensors = [torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bfloat16), torch.ones(3, 2),
               torch.ones(2, 3), torch.empty(4, device="meta"), torch.ones(()).expand(5)]
    for t in tensors:
        assert cache.of(t) == (meta_of(t), nbytes(t))
    assert cache.of(tensors[0])[0] is cache.of(tensors[3])[0]  # one record per signature
    assert cache.of_all(tensors) == (
        tuple(meta_of(t) for t in tensors), sum(nbytes(t) for t in tensors)
    )


def test_op_info_matches_the_schema():
    aten = torch.ops.aten
    for func, view, inplace in [(aten.view.default, True, False), (aten.add_.Tensor, False, True),
                                (aten.mm.default, False, False)]:
        info = op_info(func)
        assert (info.is_view, info.is_inplace) == schema_kind(func) == (view, inplace)
        assert info.name == str(func)
    assert op_info(aten.mm.default).has_flops and not op_info(aten.relu.default).has_flops
    assert op_info(aten.empty.memory_format).allocates_only
    assert op_info(torch.ops.profiler._record_function_enter_new.default).is_profiler


def test_cached_flop_counts_follow_the_shapes():
    mm = torch.ops.aten.mm.default
    a, b = torch.empty(4, 8, device="meta"), torch.empty(8, 16, device="meta")
    first = op_flops(mm, (a, b), {}, torch.empty(4, 16, device="meta"))
    again = op_flops(mm, (a, b), {}, torch.empty(4, 16, device="meta"))
    wider = op_flops(mm, (a, torch.empty(8, 32, device="meta")), {}, torch.empty(4, 32, device="meta"))
    assert (first, again, wider) == (2 * 4 * 8 * 16, 2 * 4 * 8 * 16, 2 * 4 * 8 * 32)
    conv = torch.ops.aten.convolution.default
    x, w = torch.empty(1, 3, 8, 8, device="meta"), torch.empty(4, 3, 3, 3, device="meta")
    out1 = torch.empty(1, 4, 6, 6, device="meta")
    out2 = torch.empty(1, 4, 3, 3, device="meta")  # stride 2: the same shapes in, fewer FLOPs
    one = op_flops(conv, (x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1), {}, out1)
    two = op_flops(conv, (x, w, None, [2, 2], [0, 0], [1, 1], False, [0, 0], 1), {}, out2)
    assert (one, two) == (2 * 36 * 4 * 27, 2 * 9 * 4 * 27)
