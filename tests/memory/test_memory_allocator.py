"""The caching-allocator model on allocation sequences worked out by hand, and on a sequence
recorded from the real allocator on an H200."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from levers.memory.allocator import CachingAllocator, OutOfMemory, round_request, segment_bytes

KIB, MIB = 1 << 10, 1 << 20


def test_requests_round_up_to_512_bytes():
    assert [round_request(n) for n in (1, 511, 512, 513, 1024, 1025)] == [
        512,
        512,
        512,
        1024,
        1024,
        1536,
    ]


def test_segment_sizes_follow_the_pool_rules():
    assert segment_bytes(512) == 2 * MIB  # small pool
    assert segment_bytes(MIB) == 2 * MIB
    assert segment_bytes(MIB + 512) == 20 * MIB  # large pool, under 10 MiB
    assert segment_bytes(10 * MIB - 512) == 20 * MIB
    assert segment_bytes(10 * MIB) == 10 * MIB  # 10 MiB and above: rounded to 2 MiB
    assert segment_bytes(10 * MIB + 512) == 12 * MIB


def test_small_requests_share_a_2_mib_segment_and_reuse_the_best_fit():
    allocator = CachingAllocator()
    assert allocator.malloc(1, 100) == 512
    assert allocator.malloc(2, 1000) == 1024
    assert (allocator.allocated_bytes, allocator.reserved_bytes) == (1536, 2 * MIB)
    allocator.free(1)
    assert allocator.allocated_bytes == 1024
    # the freed 512-byte block at the segment's start is the smallest that fits
    assert allocator.malloc(3, 400) == 512
    assert (allocator.allocated_bytes, allocator.reserved_bytes) == (1536, 2 * MIB)
    # 2 MiB - 1536 bytes are left in the segment: a 1 MiB request still fits there
    allocator.malloc(4, MIB)
    assert (allocator.allocated_bytes, allocator.reserved_bytes) == (1536 + MIB, 2 * MIB)
    allocator.malloc(5, MIB)  # no room left: a second small segment
    assert allocator.reserved_bytes == 4 * MIB


def test_large_requests_split_20_mib_segments_and_get_their_own_above_10_mib():
    allocator = CachingAllocator()
    allocator.malloc(1, 3 * MIB)
    assert (allocator.allocated_bytes, allocator.reserved_bytes) == (3 * MIB, 20 * MIB)
    allocator.malloc(2, 4 * MIB)  # from the 17 MiB remainder
    assert (allocator.allocated_bytes, allocator.reserved_bytes) == (7 * MIB, 20 * MIB)
    allocator.malloc(3, 18 * MIB)  # 13 MiB free is too small: an 18 MiB segment
    assert (allocator.allocated_bytes, allocator.reserved_bytes) == (25 * MIB, 38 * MIB)
    assert allocator.peak_reserved_bytes == 38 * MIB


def test_a_remainder_of_at_most_1_mib_is_not_split_off_and_counts_as_allocated():
    allocator = CachingAllocator()
    allocator.malloc(1, 5 * MIB)
    allocator.free(1)  # the 20 MiB segment is one free block again
    block = allocator.malloc(2, 19 * MIB + 512 * KIB)
    assert block == 20 * MIB
    assert allocator.allocated_bytes == 20 * MIB


def test_freed_neighbours_merge_into_one_block():
    allocator = CachingAllocator()
    for handle in (1, 2, 3):
        allocator.malloc(handle, 2 * MIB)  # three blocks at the start of one 20 MiB segment
    allocator.free(2)
    allocator.free(1)
    # 4 MiB of merged space at the start, ahead of the 14 MiB tail: best fit takes it
    assert allocator.malloc(4, 4 * MIB) == 4 * MIB
    assert allocator.reserved_bytes == 20 * MIB


def test_over_capacity_frees_cached_segments_then_runs_out():
    allocator = CachingAllocator(capacity_bytes=40 * MIB)
    allocator.malloc(1, 20 * MIB)
    allocator.free(1)  # a cached, entirely free 20 MiB segment
    allocator.malloc(2, 30 * MIB)  # 20 + 30 > 40: the cached segment is released first
    assert allocator.reserved_bytes == 30 * MIB
    assert allocator.num_segments_released == 1
    with pytest.raises(OutOfMemory):
        allocator.malloc(3, 30 * MIB)


def test_the_model_matches_the_real_allocator_on_a_recorded_sequence():
    recorded = json.loads((Path(__file__).parent / "h200_allocator_sequence.json").read_text())
    allocator = CachingAllocator()
    for event in recorded["events"]:
        if event[0] == "a":
            _, handle, nbytes, allocated, reserved = event
            allocator.malloc(handle, nbytes)
        else:
            _, handle, allocated, reserved = event
            allocator.free(handle)
        assert (allocator.allocated_bytes, allocator.reserved_bytes) == (allocated, reserved), event
